//! The work every worker runs beside deploys, each a loop over the database that any
//! number of workers may run at once.
//!
//! - `schedules`: recurring deploys (`schedule.cron`) and their ticker.
//! - `retention`: the history kept, pruned in bounded batches.

pub mod retention;
pub mod schedules;
