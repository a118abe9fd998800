//! Progress bars for long runs: on standard error, only when it is a
//! terminal, never mixed into output meant for scripts.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Work below this many steps finishes before a bar would be worth drawing.
const WORTH_A_BAR: u64 = 200_000;

/// A bar for `total` steps labelled `what`; hidden when `quiet` (JSON
/// output), when standard error is not a terminal, or for short runs.
pub fn bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet || total < WORTH_A_BAR || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} keys ({eta} left)") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}
