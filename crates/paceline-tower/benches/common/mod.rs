//! What the layer benches share: picking configurations by words on the command line.

/// The configurations whose names hold one of the words after `--` (all without words);
/// the first, the baseline every ratio divides by, always. A word that picks nothing is
/// said on stderr (matching is case-sensitive).
pub fn picked<T>(configs: Vec<(&'static str, T)>) -> Vec<(&'static str, T)> {
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for word in &words {
        if !configs.iter().any(|(name, _)| name.contains(word.as_str())) {
            eprintln!("`{word}` is in no configuration's name (case matters): it picks none");
        }
    }
    configs
        .into_iter()
        .enumerate()
        .filter(|(i, (name, _))| {
            *i == 0 || words.is_empty() || words.iter().any(|w| name.contains(w.as_str()))
        })
        .map(|(_, config)| config)
        .collect()
}
