//! A queue of writes that one task applies in groups: callers wait for their own
//! write's answer, which comes after the commit that holds it.

use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::error::StoreError;

/// One queued write and where its answer goes.
pub(crate) struct Pending<W, O> {
    pub(crate) write: W,
    pub(crate) reply: oneshot::Sender<Result<O, StoreError>>,
}

/// The writes waiting for the task that applies them (`sqlite::GroupCommit`,
/// `postgres::GroupWrites`). Dropped with its store: the task stops, and a
/// caller still waiting is told the writer stopped.
pub(crate) struct Grouped<W, O> {
    requests: mpsc::UnboundedSender<Pending<W, O>>,
    task: JoinHandle<()>,
    /// Which writer this is, for the error a caller meets if it has stopped.
    name: &'static str,
}

impl<W, O> Drop for Grouped<W, O> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<W: Send + 'static, O: Send + 'static> Grouped<W, O> {
    /// Starts `apply`, which takes the queued writes as they come and answers each.
    pub(crate) fn spawn<F, Fut>(name: &'static str, apply: F) -> Self
    where
        F: FnOnce(mpsc::UnboundedReceiver<Pending<W, O>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (requests, queued) = mpsc::unbounded_channel();
        Grouped {
            requests,
            task: tokio::spawn(apply(queued)),
            name,
        }
    }

    /// Queues `write` and waits for its answer.
    pub(crate) async fn write(&self, write: W) -> Result<O, StoreError> {
        let (reply, answer) = oneshot::channel();
        let closed = || StoreError::Unavailable(format!("the {} has stopped", self.name));
        self.requests
            .send(Pending { write, reply })
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// `first` and whatever else is queued already, up to `max` writes.
pub(crate) fn take_queued<T>(
    first: T,
    queued: &mut mpsc::UnboundedReceiver<T>,
    max: usize,
) -> Vec<T> {
    let mut taken = vec![first];
    while taken.len() < max {
        match queued.try_recv() {
            Ok(next) => taken.push(next),
            Err(_) => break,
        }
    }
    taken
}

/// Answers each write of `group` with the outputs of applying them together
/// (one per write, in order). If that failed, the writes come back to be
/// applied again one by one ([`answer_alone`]): one bad write (or a deadlock
/// with a recovery) must fail no other. A lone write that failed is answered
/// with its error.
pub(crate) fn answer_together<W, O>(
    group: Vec<Pending<W, O>>,
    together: Result<Vec<O>, sqlx::Error>,
) -> Vec<Pending<W, O>> {
    match together {
        Ok(outputs) => {
            for (pending, output) in group.into_iter().zip(outputs) {
                let _ = pending.reply.send(Ok(output));
            }
            Vec::new()
        }
        Err(_) if group.len() > 1 => group,
        Err(e) => {
            if let Some(pending) = group.into_iter().next() {
                let _ = pending.reply.send(Err(StoreError::from(e)));
            }
            Vec::new()
        }
    }
}

/// Answers one write applied alone.
pub(crate) fn answer_alone<W, O>(pending: Pending<W, O>, alone: Result<Vec<O>, sqlx::Error>) {
    let answer = alone
        .map_err(StoreError::from)
        .and_then(|outputs| outputs.into_iter().next().ok_or_else(no_output));
    let _ = pending.reply.send(answer);
}

/// The writes of `group`, to apply together.
pub(crate) fn writes<W, O>(group: &[Pending<W, O>]) -> Vec<&W> {
    group.iter().map(|p| &p.write).collect()
}

fn no_output() -> StoreError {
    StoreError::Database("a grouped write was applied but gave no answer (a bug)".into())
}
