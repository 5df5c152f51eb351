//! CLI contexts (docs/cli.md, "Contexts"), like kubectl's: named servers, each with its CA
//! and the file its token is read from, kept in `$XDG_CONFIG_HOME/manent/config.yml`
//! (else `~/.config/manent/config.yml`), one of them current.
//!
//! - `file`: the file: where it is, reading it (a problem names the file and line; one
//!   others may write is refused) and writing it (mode 0600, renamed into place).
//! - `settings`: the server, token and CA a command uses and where each came from: a flag
//!   over a `MANENT_*` variable over the context in use over the default.
//! - `commands`: `manent context add|use|list|remove`, and `manent whoami` naming the
//!   context and the origin of each setting.

pub mod commands;
pub mod file;
pub mod settings;
