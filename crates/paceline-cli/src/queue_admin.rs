//! `paceline queue`: a job queue kept in Redis, seen and repaired from the command line
//! with the configuration its services set: counts, jobs, the dead set, pauses.

use std::process::ExitCode;
use std::time::Duration;

use paceline_core::spec::parse_duration;
use paceline_core::{InputError, Policy};
use paceline_queue::job::MAX_DELAY;
use paceline_queue::{Queue, QueueError};
use paceline_server::queues::{job_body, paused_body, stats_body};
use serde_json::json;

use crate::{runtime, EXIT_STORE_FAILED};

/// What `paceline queue` does.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Print the counts by state and each group's waiting, active and next eligible time.
    Stats(Target),
    /// Print jobs by id, one JSON object per line (exit 1 if one is unknown).
    Jobs {
        #[command(flatten)]
        target: Target,
        /// The jobs' ids.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Print the dead jobs, oldest death first, one JSON object per line.
    Dead {
        #[command(flatten)]
        target: Target,
        /// Skip the first N.
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: usize,
        /// Print at most N.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        limit: usize,
    },
    /// Put dead jobs back in line with fresh attempts: those named, or every one (--all).
    RetryDead {
        #[command(flatten)]
        target: Target,
        /// Every dead job.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// The dead jobs' ids.
        #[arg(value_name = "ID", required_unless_present = "all")]
        ids: Vec<String>,
    },
    /// Remove every dead job.
    PurgeDead(Target),
    /// Pause the queue (nothing is leased), or one group (--group), for a time (--for) or
    /// until resumed; leases already given run on.
    Pause {
        #[command(flatten)]
        target: Target,
        /// Pause this group only.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// How long, e.g. `90s`, `1h`, `7d` (1ms to 365d); without it, until resumed.
        #[arg(long = "for", value_name = "DURATION")]
        length: Option<String>,
    },
    /// Print a group's policy and where it comes from; set it (--set), or give the config's
    /// back (--unset). A policy set here is kept by the store: every service sharing the
    /// queue uses it from its next call, through restarts and config changes.
    Policy {
        #[command(flatten)]
        target: Target,
        /// The group.
        #[arg(value_name = "GROUP")]
        group: String,
        /// Set this policy spec, e.g. `fixed_window:limit=10,window=10s`.
        #[arg(long, value_name = "SPEC", conflicts_with = "unset")]
        set: Option<String>,
        /// Give the group the config's policy again.
        #[arg(long)]
        unset: bool,
    },
    /// End the queue's own pause, or every pause of one group (--group).
    Resume {
        #[command(flatten)]
        target: Target,
        /// Resume this group only.
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
    },
}

/// The queue an action works on.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The Redis holding the queue: `redis://HOST:PORT[/DB]`, `rediss://...` or
    /// `redis-cluster://HOST:PORT[,HOST:PORT...]`.
    #[arg(long, value_name = "URL")]
    store: String,
    /// The queue's name (as in `[queues.NAME]`).
    #[arg(value_name = "QUEUE")]
    queue: String,
}

/// Runs `action`; prints what it found or did, or the error.
pub fn run(action: Action) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(act(action)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                QueueError::Input(_) => ExitCode::from(2),
                _ => ExitCode::from(EXIT_STORE_FAILED),
            }
        }
    }
}

/// A pause's `--for`: 1 ms to 365 days.
fn pause_length(text: &str) -> Result<Duration, QueueError> {
    let length = Duration::from_micros(parse_duration("for", text)?);
    if length < Duration::from_millis(1) || length > MAX_DELAY {
        return Err(InputError::new("for", format!("`{text}` is not from 1ms to 365d")).into());
    }
    Ok(length)
}

async fn attach(target: &Target) -> Result<Queue, QueueError> {
    Queue::attach(&target.store, &target.queue).await
}

async fn act(action: Action) -> Result<ExitCode, QueueError> {
    match action {
        Action::Stats(target) => {
            let stats = attach(&target).await?.stats().await?;
            println!("{}", stats_body(&target.queue, &stats));
        }
        Action::Jobs { target, ids } => {
            let queue = attach(&target).await?;
            let mut missing = false;
            for id in ids {
                match queue.job(&id).await? {
                    Some(job) => println!("{}", job_body(&job)),
                    None => {
                        eprintln!("error: no job `{id}` in queue `{}`", target.queue);
                        missing = true;
                    }
                }
            }
            if missing {
                return Ok(ExitCode::from(1));
            }
        }
        Action::Dead {
            target,
            offset,
            limit,
        } => {
            for job in attach(&target).await?.dead(offset, limit).await? {
                println!("{}", job_body(&job));
            }
        }
        Action::RetryDead { target, all, ids } => {
            let queue = attach(&target).await?;
            let retried = queue.retry_dead((!all).then_some(ids.as_slice())).await?;
            println!("{}", json!({ "retried": retried }));
        }
        Action::PurgeDead(target) => {
            let purged = attach(&target).await?.purge_dead().await?;
            println!("{}", json!({ "purged": purged }));
        }
        Action::Pause {
            target,
            group,
            length,
        } => {
            let length = match length {
                Some(text) => Some(pause_length(&text)?),
                None => None,
            };
            let until = attach(&target)
                .await?
                .pause(group.as_deref(), length)
                .await?;
            println!(
                "{}",
                paused_body(&target.queue, group.as_deref(), Some(until))
            );
        }
        Action::Policy {
            target,
            group,
            set,
            unset,
        } => {
            let queue = attach(&target).await?;
            if let Some(spec) = set {
                let policy: Policy = spec.parse().map_err(|e: InputError| {
                    let field = format!("set.{}", e.field());
                    e.renamed(field)
                })?;
                queue.set_policy(&group, Some(&policy)).await?;
            } else if unset {
                queue.set_policy(&group, None).await?;
            }
            let (policy, source) = queue.policy(&group).await?;
            println!(
                "{}",
                json!({"group": group, "policy": policy.to_string(), "queue": target.queue, "source": source.name()})
            );
        }
        Action::Resume { target, group } => {
            attach(&target).await?.resume(group.as_deref()).await?;
            println!("{}", paused_body(&target.queue, group.as_deref(), None));
        }
    }
    Ok(ExitCode::SUCCESS)
}
