//! Work that must not delay a run: a CPU-heavy learning job (a ranker's refit) runs on a thread
//! of its own at the lowest CPU priority, so that on a machine with few cores the drivers, the
//! actors and the store's writer are scheduled before it.

/// Runs `job` on a new thread named `name` at the lowest CPU priority (nice 19 on Linux, where
/// a thread's nice value is its own; the default priority elsewhere). The handle answers with
/// its result, or why the thread could not be started or did not finish.
pub fn spawn_lowest_priority<T: Send + 'static>(
    name: &'static str,
    job: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<Result<T, String>> {
    // The blocking pool's thread only waits for the job's: the job never runs on (and never
    // lowers the priority of) a thread the pool hands to other work.
    tokio::task::spawn_blocking(move || {
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                lower_priority(name);
                job()
            })
            .map_err(|e| format!("cannot start the thread {name}: {e}"))?
            .join()
            .map_err(|_| format!("the thread {name} panicked"))
    })
}

#[cfg(target_os = "linux")]
fn lower_priority(name: &str) {
    // PRIO_PROCESS with 0 names the calling thread on Linux.
    // SAFETY: setpriority reads its three integer arguments and touches no memory of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    if r != 0 {
        tracing::debug!(thread = name, error = %std::io::Error::last_os_error(), "the thread keeps its CPU priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_name: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_job_runs_on_its_own_thread_and_its_result_comes_back() {
        let (value, ran_on) = spawn_lowest_priority("hindsight-test-job", || {
            (21 * 2, std::thread::current().name().map(str::to_string))
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(value, 42);
        assert_eq!(ran_on.as_deref(), Some("hindsight-test-job"));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn on_linux_the_job_runs_at_the_lowest_priority() {
        // SAFETY: getpriority reads its integer arguments only.
        let nice = spawn_lowest_priority("hindsight-test-nice", || unsafe {
            libc::getpriority(libc::PRIO_PROCESS, 0)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(nice, 19);
    }

    #[tokio::test]
    async fn a_job_that_panics_is_an_error_not_a_crash() {
        let r = spawn_lowest_priority("hindsight-test-panic", || -> u8 { panic!("boom") })
            .await
            .unwrap();
        assert_eq!(
            r,
            Err("the thread hindsight-test-panic panicked".to_string())
        );
    }
}
