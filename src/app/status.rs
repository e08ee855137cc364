//! The status bar's message: what the last action did, or why it failed.

use std::time::{Duration, Instant};

/// How long a message stays in the status bar. An error used to stay up while the user went
/// on, and then read as the answer to whatever they did next.
pub const STATUS_SHOWN: Duration = Duration::from_secs(20);

/// The last message and when it was set.
#[derive(Clone, Debug, Default)]
pub struct StatusLine {
    text: String,
    since: Option<Instant>,
}

impl StatusLine {
    /// Shows `text` from now on, for [`STATUS_SHOWN`].
    pub fn set(&mut self, text: impl Into<String>) {
        self.text = text.into();
        self.since = Some(Instant::now());
    }

    /// The message while it is shown, and how much longer it will be.
    pub fn shown(&self) -> Option<(&str, Duration)> {
        let left = STATUS_SHOWN.checked_sub(self.since?.elapsed())?;
        Some((&self.text, left))
    }

    /// The last message, shown or not: what the last action said (the tests read it).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_shown_from_when_it_is_set_until_it_is_old() {
        let mut status = StatusLine::default();
        assert_eq!(status.shown(), None, "nothing before the first message");
        status.set("saved");
        let (text, left) = status.shown().unwrap();
        assert_eq!(text, "saved");
        assert!(left <= STATUS_SHOWN && left > STATUS_SHOWN / 2, "{left:?}");
        status.since = Instant::now().checked_sub(STATUS_SHOWN);
        assert_eq!(status.shown(), None, "gone once old");
        assert_eq!(status.text(), "saved", "still what the last action said");
    }
}
