//! Why the service (or the proxy) did not start: [`ServerError`].

/// A failure to start the service or the proxy (settings are validated before, as
/// [`ConfigError`](crate::ConfigError)s).
#[derive(Debug)]
pub enum ServerError {
    /// The store cannot be reached or configured.
    Store(paceline_store::Error),
    /// The address cannot be listened on.
    Listen(std::io::Error),
    /// The configured queues cannot be opened on this store.
    Queues(String),
    /// A setting is invalid: the field and what is allowed.
    Settings(paceline_core::InputError),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerError::Store(e) => write!(f, "store: {e}"),
            ServerError::Listen(e) => write!(f, "cannot listen: {e}"),
            ServerError::Queues(e) => write!(f, "queues: {e}"),
            ServerError::Settings(e) => write!(f, "{}: {}", e.field(), e.message()),
        }
    }
}

impl std::error::Error for ServerError {}
