// crates/paceline/examples/redis_queue.rs
// A producer and a worker sharing a queue in Redis: run it in as many processes as you
// like; each server (group) still starts at most 10 jobs per 10 s.
use paceline::queue::{Failure, NewJob, Queue, QueueConfig, Worker};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), paceline::queue::QueueError> {
    let url = std::env::var("PACELINE_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6380".to_string());
    let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse()?);
    let queue = Queue::open(&url, "discord-roles", config).await?;
    let payload = br#"{"user":7,"role":3}"#.to_vec();
    let job = queue
        .enqueue(NewJob::new("guild:42", payload).id("grant-7-3"))
        .await?;
    println!("{} starts at about {} µs", job.id, job.estimated_start);

    // Runs until the queue is empty; a service would stop on tokio::signal::ctrl_c().
    let drained = async {
        while queue
            .stats()
            .await
            .is_ok_and(|s| s.scheduled + s.waiting + s.active > 0)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let worker = Worker::new(queue.clone()).concurrency(16);
    let report = worker
        .run(
            |job| async move {
                match grant_role(&job.payload).await {
                    Ok(()) => Ok(()),
                    // A 429: the whole server waits; the job keeps its place in line.
                    Err(retry_after) => Err(Failure::PauseGroup {
                        error: Some("429".into()),
                        pause: retry_after,
                    }),
                }
            },
            drained,
        )
        .await?;
    println!("{report:?}");
    Ok(())
}

/// Grants the role a job names (here it only prints it); a 429 would be its retry-after.
async fn grant_role(payload: &[u8]) -> Result<(), Duration> {
    println!("granting {}", String::from_utf8_lossy(payload));
    Ok(())
}
