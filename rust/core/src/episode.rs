//! One live episode's bookkeeping, independent of the env it runs.

use crate::env::Task;

/// Why an episode ended. Names match the `stop_reason` field of a Trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum StopReason {
    Done = 0,
    Horizon = 1,
    Length = 2,
    EnvError = 3,
    BackendError = 4,
    Timeout = 5,
    Aborted = 6,
}

impl StopReason {
    pub const ALL: [StopReason; 7] = [
        StopReason::Done,
        StopReason::Horizon,
        StopReason::Length,
        StopReason::EnvError,
        StopReason::BackendError,
        StopReason::Timeout,
        StopReason::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Done => "done",
            StopReason::Horizon => "horizon",
            StopReason::Length => "length",
            StopReason::EnvError => "env_error",
            StopReason::BackendError => "backend_error",
            StopReason::Timeout => "timeout",
            StopReason::Aborted => "aborted",
        }
    }

    pub fn parse(s: &str) -> Option<StopReason> {
        Self::ALL.iter().copied().find(|r| r.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeStatus {
    /// Slot allocated, never reset.
    Empty,
    Running,
    Finished(StopReason),
}

/// Episode state kept next to the env in each pool slot.
#[derive(Debug, Clone)]
pub struct Episode {
    pub task: Task,
    pub seed: u64,
    pub turns: u32,
    /// Horizon: the episode is truncated (stop reason `horizon`) once `turns` reaches it.
    pub max_turns: Option<u32>,
    pub status: EpisodeStatus,
    pub total_reward: f32,
    /// Steps whose action the env refused as unreadable ([`crate::env::Env::refused`]).
    pub invalid_turns: u32,
    /// Accepted `undo` turns ([`crate::pool::undo`]); never rolled back.
    pub undo_turns: u32,
}

impl Default for Episode {
    fn default() -> Self {
        Self {
            task: Task::Index(0),
            seed: 0,
            turns: 0,
            max_turns: None,
            status: EpisodeStatus::Empty,
            total_reward: 0.0,
            invalid_turns: 0,
            undo_turns: 0,
        }
    }
}

impl Episode {
    pub fn start(&mut self, task: Task, seed: u64, max_turns: Option<u32>) {
        *self = Episode {
            task,
            seed,
            turns: 0,
            max_turns,
            status: EpisodeStatus::Running,
            total_reward: 0.0,
            invalid_turns: 0,
            undo_turns: 0,
        };
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        match self.status {
            EpisodeStatus::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// Record one env step; returns `truncated` (the horizon was reached without termination).
    pub fn record_step(&mut self, reward: f32, terminated: bool) -> bool {
        self.turns += 1;
        self.total_reward += reward;
        if terminated {
            self.status = EpisodeStatus::Finished(StopReason::Done);
            return false;
        }
        match self.max_turns {
            Some(cap) if self.turns >= cap => {
                self.status = EpisodeStatus::Finished(StopReason::Horizon);
                true
            }
            _ => false,
        }
    }

    /// End the episode from outside (backend error, timeout, abort, context length).
    pub fn finish(&mut self, reason: StopReason) {
        self.status = EpisodeStatus::Finished(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_truncates_without_terminating() {
        let mut e = Episode::default();
        e.start(Task::Index(3), 7, Some(2));
        assert!(!e.record_step(0.0, false));
        assert_eq!(e.status, EpisodeStatus::Running);
        assert!(e.record_step(0.5, false));
        assert_eq!(e.stop_reason(), Some(StopReason::Horizon));
        assert_eq!(e.total_reward, 0.5);
    }

    #[test]
    fn termination_wins_over_horizon() {
        let mut e = Episode::default();
        e.start(Task::Index(0), 0, Some(1));
        assert!(!e.record_step(1.0, true));
        assert_eq!(e.stop_reason(), Some(StopReason::Done));
    }

    #[test]
    fn stop_reason_names_round_trip() {
        for r in StopReason::ALL {
            assert_eq!(StopReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(StopReason::parse("nope"), None);
    }
}
