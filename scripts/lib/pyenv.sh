# Sourced by the scripts that run Python tools: makes (once) the venv target/py with what
# scripts/lib/requirements-test.txt pins, from PyPI, and sets $py to its python. target/ is
# ignored by git; a changed requirements file makes the venv anew.
py_env="target/py"
py="$py_env/bin/python"
py_requirements="scripts/lib/requirements-test.txt"
if [ ! -x "$py" ] || ! cmp -s "$py_requirements" "$py_env/requirements.txt"; then
    echo "scripts: installing $py_requirements into $py_env (PyPI)"
    rm -rf "$py_env"
    python3 -m venv "$py_env"
    "$py" -m pip install -q --disable-pip-version-check -r "$py_requirements"
    cp "$py_requirements" "$py_env/requirements.txt"
fi
