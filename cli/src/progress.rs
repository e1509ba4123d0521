//! Progress bars on stderr, drawn only when stderr is a terminal.
//!
//! Every bar hangs off one [`MultiProgress`] whose draw target is indicatif's stderr target: that
//! target hides itself when stderr is not a terminal (a pipe, a file, CI), so scripts see exactly
//! the output they saw before. Log lines and notes go through [`MultiProgress::suspend`] so they
//! do not tear a bar that is being drawn. Tables go to stdout exactly as before, printed after
//! the bars of the work they report are cleared.

use std::io::Write;
use std::sync::LazyLock;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

static MULTI: LazyLock<MultiProgress> =
    LazyLock::new(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));

/// A bar of `len` steps labelled `what`.
pub fn bar(len: u64, what: impl Into<String>) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{msg:>28} [{bar:30}] {pos}/{len} {elapsed_precise} (eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    MULTI.add(
        ProgressBar::new(len)
            .with_style(style)
            .with_message(what.into()),
    )
}

/// A spinner labelled `what`, for work of unknown length (a child process).
pub fn spinner(what: impl Into<String>) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} {msg} {elapsed_precise}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let pb = MULTI.add(
        ProgressBar::new_spinner()
            .with_style(style)
            .with_message(what.into()),
    );
    if !pb.is_hidden() {
        pb.enable_steady_tick(Duration::from_millis(120));
    }
    pb
}

/// Writes a note line to stderr (always, terminal or not), above any bar.
pub fn note(line: impl std::fmt::Display) {
    MULTI.suspend(|| eprintln!("{line}"));
}

/// A `tracing` writer: stderr, with the bars lifted while a line is written.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        MULTI.suspend(|| std::io::stderr().write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        MULTI.suspend(|| std::io::stderr().write_all(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::IsTerminal;

    #[test]
    fn bars_are_hidden_exactly_when_stderr_is_not_a_terminal() {
        let tty = std::io::stderr().is_terminal();
        let b = super::bar(3, "test");
        let s = super::spinner("test");
        assert_eq!(b.is_hidden(), !tty);
        assert_eq!(s.is_hidden(), !tty);
        b.finish_and_clear();
        s.finish_and_clear();
    }
}
