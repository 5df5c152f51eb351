//! The deploy workflow, registered on every worker.

use manent_config::Config;
use manent_engine::Engine;

/// Registers manent's workflows on a worker's engine.
pub fn register_workflows(_engine: &Engine, _config: &Config) {}
