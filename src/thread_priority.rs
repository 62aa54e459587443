//! Scheduling of the process's threads: the session loops' threads yield
//! the CPU to the API's. Off Linux, or where the kernel refuses, a thread
//! runs as before and a warning says so.

/// Makes the calling thread `nice` steps nicer than the process. When the
/// loops and Postgres keep every core busy, the kernel then runs the API's
/// threads first, so status requests do not queue behind loop work (the
/// benchmark's status p99 fell by more than half with it).
#[cfg(target_os = "linux")]
pub fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: setpriority only reads its scalar arguments. On Linux,
    // PRIO_PROCESS with who = 0 applies to the calling thread alone.
    let (current, changed) = unsafe {
        let current = libc::getpriority(libc::PRIO_PROCESS, 0);
        (
            current,
            libc::setpriority(libc::PRIO_PROCESS, 0, current + nice),
        )
    };
    if changed != 0 {
        tracing::warn!(
            nice,
            current,
            error = %std::io::Error::last_os_error(),
            "could not lower the priority of a session-loop thread"
        );
    }
}

/// Does nothing off Linux.
#[cfg(not(target_os = "linux"))]
pub fn lower_priority(_nice: i32) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_loop_thread_ends_up_nicer_than_the_process() {
        // SAFETY: getpriority only reads its scalar arguments.
        let process = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let thread = std::thread::spawn(|| {
            lower_priority(3);
            // SAFETY: as above; this thread only.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
        })
        .join()
        .expect("the probe thread ran");
        assert_eq!(thread, (process + 3).min(19));
        // The calling thread, and so the API's, keeps its own.
        // SAFETY: as above.
        let caller = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        assert_eq!(caller, process);
    }
}
