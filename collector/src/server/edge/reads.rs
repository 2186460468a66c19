//! Where the collector's reads run: profiles (`GET /profile`), record
//! queries (`GET /v1/records`) and the web pages fold on a pool of their own
//! whose threads run at a lower CPU priority than ingest ([`READ_NICE`]
//! levels below the process on Linux; threads a read starts, such as the
//! store's reader, inherit it). On a busy machine a long profile then
//! takes the CPU ingest leaves, and a sender's acknowledgement does not
//! wait behind it; on an idle one a read runs as fast as `cpt profile
//! --store`. Elsewhere the pool runs at normal priority (a nice value there
//! is the whole process's).

use std::sync::OnceLock;

/// How many nice levels the read threads run below the process (whose
/// own nice value an operator may have set; 19 is the lowest there is):
/// the scheduler gives an ingest thread about ten times a read thread's
/// share of a core they both want.
pub(crate) const READ_NICE: i32 = 10;

fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("cpt-read-{i}"))
            .start_handler(|_| lower_priority())
            .build()
            .ok()
    })
    .as_ref()
}

#[cfg(target_os = "linux")]
fn lower_priority() {
    // On Linux the nice value is per thread, and "the calling process" of
    // setpriority is the calling thread, which starts at the nice value of
    // the thread that made it. Relative to that: an absolute value would
    // put reads above ingest in a collector started under `nice`. Failing
    // leaves it where it was, which is only slower for ingest.
    let base = nice_of_this_thread();
    let _ = rustix::process::setpriority_process(None, (base + READ_NICE).min(19));
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Run the read `f` off the async runtime, on the read pool (its parallel
/// folds too); on the caller's blocking thread when the pool could not be
/// built.
///
/// # Errors
///
/// When `f` panicked.
pub(crate) async fn run<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(move || match pool() {
        Some(p) => p.install(f),
        None => f(),
    })
    .await
}

/// Start the read `f` on a thread of its own at the read priority: for a
/// read that waits on its client (a streamed answer), which would otherwise
/// hold a pool thread for as long as the client takes.
pub(crate) fn spawn<F>(f: F)
where
    F: FnOnce() + Send + 'static,
{
    let started = std::thread::Builder::new()
        .name("cpt-read-stream".into())
        .spawn(move || {
            lower_priority();
            f();
        });
    if let Err(e) = started {
        crate::server::operations::errlog::error("starting a read thread failed", || e.to_string());
    }
}

/// The nice value of the calling thread, where there is one.
#[cfg(target_os = "linux")]
fn nice_of_this_thread() -> i32 {
    rustix::process::getpriority_process(None).unwrap_or(0)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn reads_and_the_threads_they_start_run_below_ingest_priority() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (read, spawned, caller) = rt.block_on(async {
            let (read, spawned) = run(|| {
                let spawned = std::thread::spawn(nice_of_this_thread).join().unwrap();
                (nice_of_this_thread(), spawned)
            })
            .await
            .unwrap();
            // The runtime's blocking threads (ingest uses them too) keep
            // their priority.
            let caller = tokio::task::spawn_blocking(nice_of_this_thread)
                .await
                .unwrap();
            (read, spawned, caller)
        });
        let base = nice_of_this_thread();
        assert_eq!(caller, base);
        assert_eq!(read, (base + READ_NICE).min(19));
        assert_eq!(spawned, read);
    }
}
