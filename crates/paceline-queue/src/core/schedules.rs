//! The queue's schedules: kept with their next tick, and fired once per tick (see
//! [`crate::schedule`]). The caller (a [`Queue`](crate::Queue), which reads the cron
//! expressions) says which tick it saw and which comes next; the queue checks and moves
//! the schedule on in one step.

use super::QueueCore;
use crate::error::QueueError;
use crate::job::{Enqueued, NewJob};
use crate::schedule::{check_schedule_name, Schedule, ScheduleInfo};

impl QueueCore {
    /// Keeps schedule `name`, firing next at `next` (its first tick after now). The same
    /// schedule put again keeps the next tick it had, so that a process putting its
    /// configuration's schedules at start neither skips nor repeats a tick.
    pub fn put_schedule(
        &mut self,
        now: u64,
        name: &str,
        schedule: Schedule,
        next: u64,
    ) -> Result<ScheduleInfo, QueueError> {
        check_schedule_name(name)?;
        schedule.validate(self.config.max_payload, now)?;
        let now = self.tick(now)?;
        self.maintain(now);
        let next = match self.schedules.get(name) {
            Some((kept, at)) if *kept == schedule => *at,
            _ => next,
        };
        self.schedules
            .insert(name.to_string(), (schedule.clone(), next));
        Ok(ScheduleInfo {
            name: name.to_string(),
            schedule,
            next,
        })
    }

    /// Every schedule, by name.
    pub fn schedules(&self) -> Vec<ScheduleInfo> {
        self.schedules
            .iter()
            .map(|(name, (schedule, next))| ScheduleInfo {
                name: name.clone(),
                schedule: schedule.clone(),
                next: *next,
            })
            .collect()
    }

    /// Removes schedule `name`; answers whether there was one.
    pub fn delete_schedule(&mut self, now: u64, name: &str) -> Result<bool, QueueError> {
        check_schedule_name(name)?;
        let now = self.tick(now)?;
        self.maintain(now);
        Ok(self.schedules.remove(name).is_some())
    }

    /// Fires schedule `name` for its tick `due`, moving it on to `next`, if `due` is still
    /// its next tick and has come: enqueues its job and answers it. `None`: another caller
    /// fired that tick, the schedule changed or went, or the tick has not come.
    pub fn fire_schedule(
        &mut self,
        now: u64,
        name: &str,
        due: u64,
        next: u64,
    ) -> Result<Option<Enqueued>, QueueError> {
        check_schedule_name(name)?;
        let now = self.tick(now)?;
        let Some((schedule, at)) = self.schedules.get(name) else {
            return Ok(None);
        };
        if *at != due || due > now {
            return Ok(None);
        }
        let job = NewJob::new(schedule.group.clone(), schedule.payload.clone());
        let enqueued = self.enqueue(now, job)?;
        if let Some((_, at)) = self.schedules.get_mut(name) {
            *at = next.max(now.saturating_add(1));
        }
        Ok(Some(enqueued))
    }
}
