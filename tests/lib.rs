//! floe integration tests live in `integration/` (one test binary, modules inside).
