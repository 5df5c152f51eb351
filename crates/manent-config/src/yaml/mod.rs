//! Shared helpers for reading YAML documents with errors located by file, line and key path,
//! used by `manent.yml` here and by manent-model's descriptors and environment files: key
//! paths and the line where one is written, rewording serde and yaml_serde messages for a
//! person, and serde helpers for values written empty and for human durations.

mod de;
mod depth;
mod locate;
mod message;

pub use de::{
    DurationText, deserialize_duration, deserialize_opt_duration, nullable, serialize_duration,
    serialize_opt_duration,
};
pub use depth::{MAX_DEPTH, TooDeep, check_depth};
pub use locate::{Segment, child, join, locate, locate_duplicate, path_contains, segments};
pub use message::{Wording, duplicate_key, humanize, place, strip_location, strip_path};
