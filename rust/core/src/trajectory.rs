//! [`TrajectoryStore`]: token-exact trajectories of live episodes, exported packed.
//!
//! Each live episode (keyed by a `u64`, e.g. a pool slot or an episode id) holds its
//! metadata and the concatenation of its token segments: prompt/observation tokens (loss mask
//! 0, logprob 0.0) and model tokens (loss mask 1, behaviour logprob as sampled), plus one
//! reward per turn. [`TrajectoryStore::finish`] moves an episode to the completed queue
//! (its key is free again at once); [`TrajectoryStore::drain`] packs completed episodes into
//! one [`PackedBatch`] of flat arrays with offsets, ready to hand to numpy/torch without
//! per-element conversions. An episode that ended in failure (`env_error`, `backend_error`,
//! `timeout`, `aborted`) keeps its tokens but gets an all-zero loss mask.
//!
//! All batched calls validate the whole batch before changing anything: a bad batch returns
//! [`CoreError::Trajectory`] and leaves the store as it was.

use crate::episode::StopReason;
use crate::error::{CoreError, Result};
use std::collections::HashMap;

/// Metadata of one episode, set when it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpisodeMeta {
    /// GRPO group: samples of the same task that are compared with each other.
    pub group_id: u64,
    /// Index of this sample within its group.
    pub sample_index: u32,
    /// Version of the policy weights that generated the model tokens.
    pub policy_version: u32,
    /// Task index or key in the env's task set.
    pub task_id: u64,
}

/// One episode's buffers. Empty `Vec`s own no heap memory, so an idle episode costs only
/// this struct (plus its map entry) until tokens arrive.
#[derive(Debug, Clone, Default)]
struct Record {
    meta: EpisodeMeta,
    tokens: Vec<u32>,
    mask: Vec<u8>,
    logprobs: Vec<f32>,
    turn_rewards: Vec<f32>,
    /// Tokens before the first model token; `None` until a model token arrives.
    first_model: Option<u32>,
    /// Where this episode's tree forked (all 0: it did not; see [`TrajectoryStore::fork`]).
    branch: Branch,
}

/// The fork a branched episode took part in: the root that played the shared prefix and
/// the children that continue from it all carry the same values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Branch {
    /// Sample index of the root: the one episode whose copy of the prefix keeps its loss
    /// mask (the prefix is trained once).
    pub parent: u32,
    /// Turns played before the fork.
    pub turn: u32,
    /// Tokens of the shared prefix (0: not branched).
    pub pos: u32,
}

#[derive(Debug, Clone)]
struct Completed {
    key: u64,
    record: Record,
    stop_reason: StopReason,
    reward: f32,
}

/// Completed trajectories packed into flat arrays. Episode `b` owns tokens
/// `offsets[b]..offsets[b+1]` and turns `turn_offsets[b]..turn_offsets[b+1]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PackedBatch {
    pub keys: Vec<u64>,
    pub group_id: Vec<u64>,
    pub sample_index: Vec<u32>,
    pub policy_version: Vec<u32>,
    pub task_id: Vec<u64>,
    pub token_ids: Vec<u32>,
    pub offsets: Vec<i64>,
    pub loss_mask: Vec<u8>,
    pub logprobs: Vec<f32>,
    /// Sum of the turn rewards, or the override given to `finish`.
    pub rewards: Vec<f32>,
    pub turn_rewards: Vec<f32>,
    pub turn_offsets: Vec<i64>,
    pub num_turns: Vec<u32>,
    /// [`StopReason`] codes (`StopReason as u8`).
    pub stop_reason: Vec<u8>,
    /// Tokens before the first model token (all of them when there is none).
    pub prompt_len: Vec<u32>,
    /// [`Branch::parent`]: the root's sample index for a branched episode, the episode's own
    /// sample index otherwise (so `(group_id, branch_parent)` is always its step group).
    pub branch_parent: Vec<u32>,
    /// [`Branch::turn`] (0: not branched).
    pub branch_turn: Vec<u32>,
    /// [`Branch::pos`] (0: not branched).
    pub branch_pos: Vec<u32>,
}

impl PackedBatch {
    /// Number of trajectories.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Whether a stop reason marks a failed rollout (its loss mask is zeroed).
pub fn is_failure(reason: StopReason) -> bool {
    matches!(
        reason,
        StopReason::EnvError | StopReason::BackendError | StopReason::Timeout | StopReason::Aborted
    )
}

fn err<T>(msg: String) -> Result<T> {
    Err(CoreError::Trajectory(msg))
}

/// Live and completed trajectories. See the module docs.
#[derive(Debug, Default)]
pub struct TrajectoryStore {
    live: HashMap<u64, Record>,
    completed: Vec<Completed>,
}

impl TrajectoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of live (begun, not finished) episodes.
    pub fn num_live(&self) -> usize {
        self.live.len()
    }

    /// Number of finished episodes waiting to be drained.
    pub fn num_completed(&self) -> usize {
        self.completed.len()
    }

    pub fn is_live(&self, key: u64) -> bool {
        self.live.contains_key(&key)
    }

    /// Tokens held by a live episode.
    pub fn num_tokens(&self, key: u64) -> Result<usize> {
        Ok(self.record(key)?.tokens.len())
    }

    /// Turns recorded so far by a live episode.
    pub fn num_turns(&self, key: u64) -> Result<usize> {
        Ok(self.record(key)?.turn_rewards.len())
    }

    /// Bytes of bookkeeping per live episode before any token arrives (record + map entry).
    pub fn idle_bytes_per_episode() -> usize {
        std::mem::size_of::<Record>() + std::mem::size_of::<u64>() + 1
    }

    /// Approximate heap bytes held (capacities of all buffers plus bookkeeping).
    pub fn heap_bytes(&self) -> usize {
        fn rec(r: &Record) -> usize {
            r.tokens.capacity() * 4
                + r.mask.capacity()
                + r.logprobs.capacity() * 4
                + r.turn_rewards.capacity() * 4
        }
        let live: usize = self.live.values().map(rec).sum();
        let done: usize = self.completed.iter().map(|c| rec(&c.record)).sum();
        live + done
            + self.live.capacity() * Self::idle_bytes_per_episode()
            + self.completed.capacity() * std::mem::size_of::<Completed>()
    }

    fn record(&self, key: u64) -> Result<&Record> {
        self.live.get(&key).ok_or_else(|| self.missing(key))
    }

    fn missing(&self, key: u64) -> CoreError {
        if self.completed.iter().any(|c| c.key == key) {
            CoreError::Trajectory(format!(
                "episode {key} has finished; begin it again before appending"
            ))
        } else {
            CoreError::Trajectory(format!("unknown episode key {key}; call begin first"))
        }
    }

    fn check_live(&self, keys: &[u64]) -> Result<()> {
        match keys.iter().find(|k| !self.live.contains_key(k)) {
            Some(&k) => Err(self.missing(k)),
            None => Ok(()),
        }
    }

    /// Start an episode under `key`.
    pub fn begin(&mut self, key: u64, meta: EpisodeMeta) -> Result<()> {
        self.begin_batch(&[key], &[meta])
    }

    /// Start many episodes. A key that is live or repeated in the batch is an error.
    pub fn begin_batch(&mut self, keys: &[u64], metas: &[EpisodeMeta]) -> Result<()> {
        if keys.len() != metas.len() {
            return err(format!(
                "begin got {} keys and {} metadata rows; lengths must match",
                keys.len(),
                metas.len()
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        for &k in keys {
            if self.live.contains_key(&k) || !seen.insert(k) {
                return err(format!("episode {k} has already begun and is not finished"));
            }
        }
        self.live.reserve(keys.len());
        for (&k, &meta) in keys.iter().zip(metas) {
            self.live.insert(
                k,
                Record {
                    meta,
                    ..Record::default()
                },
            );
        }
        Ok(())
    }

    /// Append one segment to a live episode. `logprobs` is required for model segments
    /// (one per token) and ignored otherwise (stored as 0.0); `None` means all 0.0.
    pub fn append(
        &mut self,
        key: u64,
        tokens: &[u32],
        is_model: bool,
        logprobs: Option<&[f32]>,
    ) -> Result<()> {
        let offsets = [0i64, tokens.len() as i64];
        let lp = match logprobs {
            Some(l) => l,
            None => &[],
        };
        self.append_batch(&[key], tokens, &offsets, &[is_model], lp)
    }

    /// Append segment `i` (`flat_tokens[offsets[i]..offsets[i+1]]`) to episode `keys[i]`, in
    /// order (a key may appear several times). `flat_logprobs` is aligned with `flat_tokens`
    /// (values of non-model segments are ignored) or empty for all 0.0.
    pub fn append_batch(
        &mut self,
        keys: &[u64],
        flat_tokens: &[u32],
        offsets: &[i64],
        is_model: &[bool],
        flat_logprobs: &[f32],
    ) -> Result<()> {
        let n = keys.len();
        if offsets.len() != n + 1 || is_model.len() != n {
            return err(format!(
                "append got {n} keys, {} offsets (need {}) and {} is_model flags",
                offsets.len(),
                n + 1,
                is_model.len()
            ));
        }
        if !flat_logprobs.is_empty() && flat_logprobs.len() != flat_tokens.len() {
            return err(format!(
                "append got {} logprobs for {} tokens; pass one per token or none",
                flat_logprobs.len(),
                flat_tokens.len()
            ));
        }
        if offsets[0] != 0 || offsets[n] != flat_tokens.len() as i64 {
            return err(format!(
                "offsets must start at 0 and end at the token count {} (got {} .. {})",
                flat_tokens.len(),
                offsets[0],
                offsets[n]
            ));
        }
        if let Some(w) = offsets.windows(2).find(|w| w[1] < w[0]) {
            return err(format!(
                "offsets must not decrease (got {} then {})",
                w[0], w[1]
            ));
        }
        self.check_live(keys)?;
        for (i, &k) in keys.iter().enumerate() {
            let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
            let rec = self.live.get_mut(&k).expect("validated above");
            if is_model[i] {
                if rec.first_model.is_none() && b > a {
                    rec.first_model = Some(rec.tokens.len() as u32);
                }
                rec.mask.resize(rec.mask.len() + (b - a), 1);
                if flat_logprobs.is_empty() {
                    rec.logprobs.resize(rec.logprobs.len() + (b - a), 0.0);
                } else {
                    rec.logprobs.extend_from_slice(&flat_logprobs[a..b]);
                }
            } else {
                rec.mask.resize(rec.mask.len() + (b - a), 0);
                rec.logprobs.resize(rec.logprobs.len() + (b - a), 0.0);
            }
            rec.tokens.extend_from_slice(&flat_tokens[a..b]);
        }
        Ok(())
    }

    /// One whole turn of a live episode, with one lookup: the model's reply (mask 1, one
    /// behaviour logprob per token or none for all 0.0), then `close` as a prompt token
    /// (mask 0) when the reply was cut before its end-of-turn token, the turn's reward, and
    /// the next `observation` (mask 0) if the context stays below `max_tokens` with it.
    /// Returns whether the observation was appended. Nothing changes on error.
    #[allow(clippy::too_many_arguments)]
    pub fn append_turn(
        &mut self,
        key: u64,
        reply: &[u32],
        logprobs: &[f32],
        close: Option<u32>,
        reward: f32,
        observation: Option<&[u32]>,
        max_tokens: usize,
    ) -> Result<bool> {
        if !logprobs.is_empty() && logprobs.len() != reply.len() {
            return err(format!(
                "append_turn got {} logprobs for {} tokens; pass one per token or none",
                logprobs.len(),
                reply.len()
            ));
        }
        let Some(rec) = self.live.get_mut(&key) else {
            return Err(self.missing(key));
        };
        if rec.first_model.is_none() && !reply.is_empty() {
            rec.first_model = Some(rec.tokens.len() as u32);
        }
        rec.tokens.extend_from_slice(reply);
        rec.mask.resize(rec.mask.len() + reply.len(), 1);
        if logprobs.is_empty() {
            rec.logprobs.resize(rec.logprobs.len() + reply.len(), 0.0);
        } else {
            rec.logprobs.extend_from_slice(logprobs);
        }
        if let Some(t) = close {
            rec.tokens.push(t);
            rec.mask.push(0);
            rec.logprobs.push(0.0);
        }
        rec.turn_rewards.push(reward);
        let Some(obs) = observation else {
            return Ok(false);
        };
        if rec.tokens.len() + obs.len() >= max_tokens {
            return Ok(false);
        }
        rec.tokens.extend_from_slice(obs);
        rec.mask.resize(rec.mask.len() + obs.len(), 0);
        rec.logprobs.resize(rec.logprobs.len() + obs.len(), 0.0);
        Ok(true)
    }

    /// Forks live episode `src` into new live episodes `dst` (one per sample index in
    /// `samples`, same group, task and policy version): each starts with `src`'s tokens,
    /// logprobs and turn rewards so far, with a zero loss mask over that shared prefix, so
    /// that the prefix is trained once, through `src`. `src` and every child record the fork
    /// ([`Branch`]: `src`'s sample index, its turns and tokens so far). An episode forks at
    /// most once, and only after a model token. Nothing changes on error.
    pub fn fork(&mut self, src: u64, dst: &[u64], samples: &[u32]) -> Result<()> {
        if dst.len() != samples.len() {
            return err(format!(
                "fork got {} keys and {} sample indices; lengths must match",
                dst.len(),
                samples.len()
            ));
        }
        let rec = self.record(src)?;
        if rec.branch.pos != 0 {
            return err(format!(
                "episode {src} forked already (at turn {}); an episode forks once",
                rec.branch.turn
            ));
        }
        if rec.first_model.is_none() {
            return err(format!(
                "episode {src} has no model tokens yet; fork after its first turn"
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(dst.len());
        if let Some(&k) = dst
            .iter()
            .find(|&&k| k == src || self.live.contains_key(&k) || !seen.insert(k))
        {
            return err(format!("episode {k} has already begun and is not finished"));
        }
        let mut root = self.live.remove(&src).expect("checked above");
        root.branch = Branch {
            parent: root.meta.sample_index,
            turn: root.turn_rewards.len() as u32,
            pos: root.tokens.len() as u32,
        };
        self.live.reserve(dst.len());
        for (&k, &sample) in dst.iter().zip(samples) {
            let child = Record {
                meta: EpisodeMeta {
                    sample_index: sample,
                    ..root.meta
                },
                tokens: root.tokens.clone(),
                mask: vec![0; root.mask.len()],
                logprobs: root.logprobs.clone(),
                turn_rewards: root.turn_rewards.clone(),
                first_model: None,
                branch: root.branch,
            };
            self.live.insert(k, child);
        }
        self.live.insert(src, root);
        Ok(())
    }

    /// The sum of the turn rewards recorded so far by a live episode.
    pub fn reward(&self, key: u64) -> Result<f32> {
        Ok(self.record(key)?.turn_rewards.iter().sum())
    }

    /// Add `delta` to the reward of turn `turn` (0-based) of a live episode, a reward known
    /// only once the episode's outcome is (e.g. a bonus on a plan turn of a solved episode).
    pub fn add_reward(&mut self, key: u64, turn: usize, delta: f32) -> Result<()> {
        let n = self.record(key)?.turn_rewards.len();
        if turn >= n {
            return err(format!(
                "episode {key} has {n} turns; turn {turn} does not exist"
            ));
        }
        self.live.get_mut(&key).expect("checked above").turn_rewards[turn] += delta;
        Ok(())
    }

    /// Close the current turn of `key` with its reward.
    pub fn add_turn(&mut self, key: u64, reward: f32) -> Result<()> {
        self.add_turns(&[key], &[reward])
    }

    /// Close one turn per key (a key may appear several times) with its reward.
    pub fn add_turns(&mut self, keys: &[u64], rewards: &[f32]) -> Result<()> {
        if keys.len() != rewards.len() {
            return err(format!(
                "add_turns got {} keys and {} rewards; lengths must match",
                keys.len(),
                rewards.len()
            ));
        }
        self.check_live(keys)?;
        for (&k, &r) in keys.iter().zip(rewards) {
            self.live
                .get_mut(&k)
                .expect("validated above")
                .turn_rewards
                .push(r);
        }
        Ok(())
    }

    /// Finish `key`: it joins the completed queue and its key is free again. The reward is
    /// the sum of its turn rewards unless `reward_override` is given. A failure reason
    /// zeroes the loss mask.
    pub fn finish(
        &mut self,
        key: u64,
        stop_reason: StopReason,
        reward_override: Option<f32>,
    ) -> Result<()> {
        self.finish_batch(&[key], &[stop_reason], &[reward_override])
    }

    /// Finish many episodes. `stop_reasons` has one entry per key or a single entry for all;
    /// `reward_overrides` likewise, or is empty for none.
    pub fn finish_batch(
        &mut self,
        keys: &[u64],
        stop_reasons: &[StopReason],
        reward_overrides: &[Option<f32>],
    ) -> Result<()> {
        let n = keys.len();
        let fits = |len: usize| len == n || len == 1;
        if !fits(stop_reasons.len()) && n > 0 {
            return err(format!(
                "finish got {n} keys and {} stop reasons",
                stop_reasons.len()
            ));
        }
        if !(reward_overrides.is_empty() || fits(reward_overrides.len())) && n > 0 {
            return err(format!(
                "finish got {n} keys and {} reward overrides",
                reward_overrides.len()
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(n);
        if let Some(&k) = keys.iter().find(|&&k| !seen.insert(k)) {
            return err(format!("episode {k} appears twice in one finish batch"));
        }
        self.check_live(keys)?;
        self.completed.reserve(n);
        for (i, &k) in keys.iter().enumerate() {
            let reason = stop_reasons[if stop_reasons.len() == 1 { 0 } else { i }];
            let over = match reward_overrides.len() {
                0 => None,
                1 => reward_overrides[0],
                _ => reward_overrides[i],
            };
            let mut record = self.live.remove(&k).expect("validated above");
            if is_failure(reason) {
                record.mask.fill(0);
            }
            let reward = over.unwrap_or_else(|| record.turn_rewards.iter().sum());
            self.completed.push(Completed {
                key: k,
                record,
                stop_reason: reason,
                reward,
            });
        }
        Ok(())
    }

    /// Keeps the loss mask of live episode `key` only on the model-token runs that begin at
    /// token positions `starts` (each run: the maximal stretch of mask 1 from there) and
    /// zeroes it everywhere else: the episode then trains on those replies alone (a
    /// reflection retry's reflections). A start that is not the first token of a run is an
    /// error, and nothing changes on error.
    pub fn credit_only(&mut self, key: u64, starts: &[u32]) -> Result<()> {
        let rec = self.record(key)?;
        for &a in starts {
            let a = a as usize;
            if a >= rec.mask.len() || rec.mask[a] != 1 || (a > 0 && rec.mask[a - 1] == 1) {
                return err(format!(
                    "episode {key}: token {a} does not begin a run of model tokens"
                ));
            }
        }
        let rec = self.live.get_mut(&key).expect("checked above");
        let mut keep = vec![0u8; rec.mask.len()];
        for &a in starts {
            let a = a as usize;
            let end = rec.mask[a..]
                .iter()
                .position(|&m| m != 1)
                .map_or(rec.mask.len(), |n| a + n);
            keep[a..end].fill(1);
        }
        rec.mask = keep;
        Ok(())
    }

    /// Drop a live episode without producing a trajectory.
    pub fn discard(&mut self, key: u64) -> Result<()> {
        self.live
            .remove(&key)
            .map(|_| ())
            .ok_or_else(|| self.missing(key))
    }

    /// Finish every live episode with `reason` (e.g. `aborted` at shutdown); returns how many.
    pub fn finish_all(&mut self, reason: StopReason) -> usize {
        let mut keys: Vec<u64> = self.live.keys().copied().collect();
        keys.sort_unstable();
        let n = keys.len();
        self.finish_batch(&keys, &[reason], &[])
            .expect("all keys are live and distinct");
        n
    }

    /// Pack the completed episodes (the oldest `max` of them, or all) in finish order.
    pub fn drain(&mut self, max: Option<usize>) -> PackedBatch {
        let take = max.unwrap_or(usize::MAX).min(self.completed.len());
        let done: Vec<Completed> = self.completed.drain(..take).collect();
        pack(done)
    }
}

fn pack(done: Vec<Completed>) -> PackedBatch {
    let b = done.len();
    let total_tokens: usize = done.iter().map(|c| c.record.tokens.len()).sum();
    let total_turns: usize = done.iter().map(|c| c.record.turn_rewards.len()).sum();
    let mut out = PackedBatch {
        keys: Vec::with_capacity(b),
        group_id: Vec::with_capacity(b),
        sample_index: Vec::with_capacity(b),
        policy_version: Vec::with_capacity(b),
        task_id: Vec::with_capacity(b),
        token_ids: Vec::with_capacity(total_tokens),
        offsets: Vec::with_capacity(b + 1),
        loss_mask: Vec::with_capacity(total_tokens),
        logprobs: Vec::with_capacity(total_tokens),
        rewards: Vec::with_capacity(b),
        turn_rewards: Vec::with_capacity(total_turns),
        turn_offsets: Vec::with_capacity(b + 1),
        num_turns: Vec::with_capacity(b),
        stop_reason: Vec::with_capacity(b),
        prompt_len: Vec::with_capacity(b),
        branch_parent: Vec::with_capacity(b),
        branch_turn: Vec::with_capacity(b),
        branch_pos: Vec::with_capacity(b),
    };
    out.offsets.push(0);
    out.turn_offsets.push(0);
    for c in done {
        let r = c.record;
        out.keys.push(c.key);
        out.group_id.push(r.meta.group_id);
        out.sample_index.push(r.meta.sample_index);
        out.policy_version.push(r.meta.policy_version);
        out.task_id.push(r.meta.task_id);
        out.prompt_len
            .push(r.first_model.unwrap_or(r.tokens.len() as u32));
        let parent = if r.branch.pos == 0 {
            r.meta.sample_index
        } else {
            r.branch.parent
        };
        out.branch_parent.push(parent);
        out.branch_turn.push(r.branch.turn);
        out.branch_pos.push(r.branch.pos);
        out.token_ids.extend_from_slice(&r.tokens);
        out.loss_mask.extend_from_slice(&r.mask);
        out.logprobs.extend_from_slice(&r.logprobs);
        out.offsets.push(out.token_ids.len() as i64);
        out.num_turns.push(r.turn_rewards.len() as u32);
        out.turn_rewards.extend_from_slice(&r.turn_rewards);
        out.turn_offsets.push(out.turn_rewards.len() as i64);
        out.rewards.push(c.reward);
        out.stop_reason.push(c.stop_reason as u8);
    }
    out
}

#[cfg(test)]
mod tests;
