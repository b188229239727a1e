//! Integration-test helpers (see `tests/` for the tests themselves).
