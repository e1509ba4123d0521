//! Replay: the ingest DLQ (moto SQS) and key lists through the ingest path. Every object lands
//! once, a message is deleted only once its objects are settled (committed, committed already,
//! quarantined), everything else stays, reported; a lost commit answer or a lost delete loses
//! no message and duplicates nothing; a second replay changes nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use floe::commit::Committer;
use floe::ingest::replay::{
    Action, MessageQueue, Outcome, QueuedMessage, ReplayOptions, ReplayReport, SqsQueue,
};
use floe::ingest::Ingestor;

use crate::faults::{lost_answer_then_dark, Blackout, BlackoutLoads};
use crate::harness::{moto, orders, storage, unique, TestEnv};

/// What the first deletes do (then they work).
#[derive(Debug, Clone, Copy)]
pub(crate) enum DeleteFault {
    /// The message is deleted and the answer is lost (an error comes back).
    LostAnswer,
    /// The delete fails before it reaches the queue.
    Refused,
}

/// The DLQ as the replay sees it, recording what it received (so a test can make the messages
/// it left visible again instead of waiting out their visibility timeout), with optional
/// delete faults.
pub(crate) struct TestQueue {
    inner: SqsQueue,
    received: Mutex<Vec<QueuedMessage>>,
    delete_faults: Mutex<Vec<DeleteFault>>,
}

impl TestQueue {
    pub(crate) fn new(sqs: &aws_sdk_sqs::Client, url: &str) -> Self {
        Self::with_delete_faults(sqs, url, Vec::new())
    }

    fn with_delete_faults(sqs: &aws_sdk_sqs::Client, url: &str, faults: Vec<DeleteFault>) -> Self {
        Self {
            inner: SqsQueue::new(sqs.clone(), url),
            received: Mutex::new(Vec::new()),
            delete_faults: Mutex::new(faults),
        }
    }

    /// Every message received so far visible again (deleted ones answer an error: ignored).
    pub(crate) async fn release_all(&self) {
        let received: Vec<QueuedMessage> = std::mem::take(&mut *self.received.lock().unwrap());
        for m in &received {
            let _ = self.inner.release(m).await;
        }
    }
}

#[async_trait::async_trait]
impl MessageQueue for TestQueue {
    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> floe::Result<Vec<QueuedMessage>> {
        let got = self.inner.receive(max, visibility, wait).await?;
        self.received.lock().unwrap().extend(got.iter().cloned());
        Ok(got)
    }

    async fn delete(&self, message: &QueuedMessage) -> floe::Result<()> {
        let fault = {
            let mut faults = self.delete_faults.lock().unwrap();
            (!faults.is_empty()).then(|| faults.remove(0))
        };
        let lost = || floe::Error::new(floe::ErrorKind::Storage, "injected: delete answer lost");
        match fault {
            Some(DeleteFault::LostAnswer) => {
                self.inner.delete(message).await?;
                Err(lost().with_retryable(true))
            }
            Some(DeleteFault::Refused) => Err(floe::Error::new(
                floe::ErrorKind::Storage,
                "injected: delete refused",
            )
            .with_retryable(true)),
            None => self.inner.delete(message).await,
        }
    }

    async fn release(&self, message: &QueuedMessage) -> floe::Result<()> {
        self.inner.release(message).await
    }
}

pub(crate) async fn sqs() -> aws_sdk_sqs::Client {
    let sdk = floe::store::sdk_config(&storage(), Some(moto())).await;
    aws_sdk_sqs::Client::new(&sdk)
}

/// A fresh queue standing for the ingest DLQ: its URL.
pub(crate) async fn dlq(sqs: &aws_sdk_sqs::Client) -> String {
    sqs.create_queue()
        .queue_name(unique("ingest-dlq"))
        .send()
        .await
        .expect("create queue")
        .queue_url()
        .expect("queue url")
        .to_string()
}

pub(crate) async fn send(sqs: &aws_sdk_sqs::Client, url: &str, body: &str) {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .expect("send message");
}

/// (visible, in flight) messages of the queue.
pub(crate) async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes");
    let n = |a: A| {
        out.attributes()
            .and_then(|m| m.get(&a))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (
        n(A::ApproximateNumberOfMessages),
        n(A::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Replay options for tests: no long polling (moto answers at once).
pub(crate) fn options() -> ReplayOptions {
    ReplayOptions {
        wait: Duration::ZERO,
        visibility_timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

async fn snapshots(env: &TestEnv, ingestor: &Ingestor) -> usize {
    ingestor
        .catalog()
        .load_table(&env.ident())
        .await
        .unwrap()
        .metadata()
        .snapshots()
        .count()
}

/// The report's totals reconcile: every object has one outcome, every message one fate.
fn reconciles(r: &ReplayReport) {
    assert_eq!(
        r.objects,
        r.replayed + r.already_committed + r.quarantined + r.skipped + r.failed + r.would_replay,
        "{r:#?}"
    );
    let kept = r.items.iter().filter(|i| i.action == Action::Kept).count() as u64;
    assert_eq!(r.messages, r.deleted + r.left + kept, "{r:#?}");
    assert_eq!(r.items.len() as u64, r.messages, "{r:#?}");
}

fn outcomes(r: &ReplayReport) -> Vec<(String, Outcome)> {
    r.items
        .iter()
        .flat_map(|i| i.objects.iter())
        .map(|o| {
            (
                o.object.rsplit('/').next().unwrap_or("").to_string(),
                o.outcome,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlq_redrive_lands_each_object_once_and_deletes_only_settled_messages() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    // (a) never ingested; (b) committed already; (d) malformed whole (not gzip).
    env.put("orders/a.jsonl", orders(20, 1)).await;
    env.put("orders/b.jsonl", orders(20, 2)).await;
    env.ingest(&ingestor, "orders/b.jsonl").await.unwrap();
    env.put("orders/d.jsonl.gz", b"this is not gzip".to_vec())
        .await;
    let sqs = sqs().await;
    let url = dlq(&sqs).await;
    // The shapes the ingest queue carries: an S3 notification, an EventBridge event, an SNS
    // envelope; (c) is a second message for (a); (e) is garbage.
    send(&sqs, &url, &env.s3_notification("orders/a.jsonl", None)).await;
    let eb = serde_json::json!({"detail-type": "Object Created", "source": "aws.s3",
        "time": chrono::Utc::now().to_rfc3339(),
        "detail": {"bucket": {"name": env.bucket}, "object": {"key": "orders/b.jsonl"}}});
    send(&sqs, &url, &eb.to_string()).await;
    let sns = serde_json::json!({"Type": "Notification",
        "Message": env.s3_notification("orders/a.jsonl", None)});
    send(&sqs, &url, &sns.to_string()).await;
    send(&sqs, &url, &env.s3_notification("orders/d.jsonl.gz", None)).await;
    send(&sqs, &url, "}{ not a notification").await;
    let queue = TestQueue::new(&sqs, &url);

    // Dry run: what would be replayed, what is in already; nothing changes, all stay visible.
    let dry = ingestor
        .replay_queue(
            &queue,
            &ReplayOptions {
                dry_run: true,
                ..options()
            },
        )
        .await
        .unwrap();
    reconciles(&dry);
    assert_eq!(
        (dry.messages, dry.deleted, dry.left, dry.unparsed),
        (5, 0, 0, 1)
    );
    assert_eq!(
        (dry.objects, dry.would_replay, dry.already_committed),
        (4, 3, 1),
        "{dry:#?}"
    );
    let mut seen = outcomes(&dry);
    seen.sort_by_key(|(k, o)| (k.clone(), format!("{o:?}")));
    assert_eq!(
        seen,
        [
            ("a.jsonl".to_string(), Outcome::WouldReplay),
            ("a.jsonl".to_string(), Outcome::WouldReplay),
            ("b.jsonl".to_string(), Outcome::AlreadyCommitted),
            ("d.jsonl.gz".to_string(), Outcome::WouldReplay),
        ]
    );
    assert_eq!(snapshots(&env, &ingestor).await, 1);
    assert_eq!(
        depth(&sqs, &url).await,
        (5, 0),
        "visible again after a dry run"
    );

    let r = ingestor.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&r);
    assert_eq!(
        (r.messages, r.deleted, r.left, r.unparsed),
        (5, 4, 1, 1),
        "{r:#?}"
    );
    assert_eq!(
        (
            r.objects,
            r.replayed,
            r.already_committed,
            r.quarantined,
            r.skipped,
            r.failed
        ),
        (4, 1, 2, 1, 0, 0),
        "{r:#?}"
    );
    assert_eq!((r.records_committed, r.commits), (20, 1));
    let left: Vec<_> = r
        .items
        .iter()
        .filter(|i| i.action == Action::Left)
        .collect();
    assert_eq!(left.len(), 1);
    assert!(left[0].unparsed && left[0].objects.is_empty());
    assert!(
        left[0]
            .reason
            .as_deref()
            .is_some_and(|e| e.contains("cannot be understood")),
        "{:?}",
        left[0]
    );
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, ids), (40, 40), "every record exactly once");
    assert_eq!(snapshots(&env, &ingestor).await, 2);
    let quarantine = env.keys("quarantine/orders/orders/d.jsonl.gz").await;
    assert_eq!(quarantine.len(), 1, "{quarantine:?}");
    assert_eq!(
        depth(&sqs, &url).await,
        (0, 1),
        "only the garbage message stays"
    );

    // Again, with the garbage message visible: it is reported again, nothing else happens.
    queue.release_all().await;
    let again = ingestor.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&again);
    assert_eq!(
        (again.messages, again.deleted, again.left, again.unparsed),
        (1, 0, 1, 1)
    );
    assert_eq!((again.objects, again.commits), (0, 0));
    assert!(!again.settled());
    assert_eq!(snapshots(&env, &ingestor).await, 2);
    assert_eq!(env.count_rows(catalog.as_ref()).await, 40);
    // --max bounds the messages handled.
    queue.release_all().await;
    let bounded = ingestor
        .replay_queue(
            &queue,
            &ReplayOptions {
                max: Some(0),
                ..options()
            },
        )
        .await
        .unwrap();
    assert_eq!(bounded.messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_list_replays_the_versions_it_names_once() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let k1 = env.put_version("orders/k1.jsonl", orders(20, 11)).await;
    let etag1 = k1.e_tag().unwrap().trim_matches('"').to_string();
    env.put("orders/k2.jsonl", orders(20, 12)).await;
    env.ingest(&ingestor, "orders/k2.jsonl").await.unwrap();
    let b = &env.bucket;
    let lines = format!(
        "# what _source records, and plain keys\n\n\
         s3://{b}/orders/k1.jsonl#{etag1}\n\
         s3://{b}/orders/k2.jsonl\n\
         s3://{b}/orders/k1.jsonl\n\
         s3://{b}/misc/notes.txt\n\
         s3://{b}/orders/gone.jsonl\n\
         s3://{b}/orders/k2.jsonl#0123456789abcdef0123456789abcdef\n\
         not a key\n"
    );
    let dry = ingestor
        .replay_objects(
            &lines,
            &ReplayOptions {
                dry_run: true,
                ..options()
            },
        )
        .await;
    reconciles(&dry);
    assert_eq!(
        (
            dry.messages,
            dry.would_replay,
            dry.already_committed,
            dry.skipped,
            dry.unparsed
        ),
        (7, 2, 1, 3, 1),
        "{dry:#?}"
    );
    assert_eq!(snapshots(&env, &ingestor).await, 1);

    let r = ingestor.replay_objects(&lines, &options()).await;
    reconciles(&r);
    assert_eq!(
        (
            r.replayed,
            r.already_committed,
            r.skipped,
            r.failed,
            r.unparsed
        ),
        (1, 2, 3, 0, 1),
        "{r:#?}"
    );
    assert_eq!(r.deleted + r.left, 0, "no messages");
    let lines_of: Vec<(Option<usize>, Vec<Outcome>)> = r
        .items
        .iter()
        .map(|i| (i.line, i.objects.iter().map(|o| o.outcome).collect()))
        .collect();
    use Outcome::*;
    assert_eq!(
        lines_of,
        [
            (Some(3), vec![Replayed]),
            (Some(4), vec![AlreadyCommitted]),
            (Some(5), vec![AlreadyCommitted]),
            (Some(6), vec![Skipped]),
            (Some(7), vec![Skipped]),
            (Some(8), vec![Skipped]),
            (Some(9), vec![]),
        ]
    );
    assert!(!r.settled());
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, ids), (40, 40));
    let again = ingestor.replay_objects(&lines, &options()).await;
    assert_eq!((again.replayed, again.already_committed), (0, 3));
    assert_eq!(snapshots(&env, &ingestor).await, 2);
}

/// The replay's commit lands but its answer is lost and the catalog goes dark: the outcome is
/// unknown, the re-read cannot settle it, so no message is deleted. The next replay finds every
/// object committed (once) and only then deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_deletes_no_message_until_a_re_read_finds_the_object() {
    let env = TestEnv::new("sqlite").await;
    let sqs = sqs().await;
    let url = dlq(&sqs).await;
    for i in 0..3 {
        let key = format!("orders/u{i}.jsonl");
        env.put(&key, orders(20, 30 + i)).await;
        send(&sqs, &url, &env.s3_notification(&key, None)).await;
    }
    let blackout = Arc::new(Blackout::default());
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let dark: Arc<dyn iceberg::Catalog> = Arc::new(floe::catalog::Hooked::new(
        catalog,
        BlackoutLoads(blackout.clone()),
    ));
    let swap = floe::catalog::pointer_swap(&env.config).await.unwrap();
    let swap = lost_answer_then_dark(blackout, 1)(swap);
    let store = floe::store::from_config(&env.config.storage).await;
    let ingestor = Ingestor::with_parts(env.config.clone(), Committer::new(dark, swap), store)
        .await
        .unwrap();
    let queue = TestQueue::new(&sqs, &url);
    let r = ingestor.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&r);
    assert_eq!(
        (r.messages, r.deleted, r.left, r.failed),
        (3, 0, 3, 3),
        "{r:#?}"
    );
    for o in r.items.iter().flat_map(|i| i.objects.iter()) {
        assert_eq!(
            (o.outcome, o.retryable),
            (Outcome::Failed, Some(true)),
            "{o:?}"
        );
        let reason = o.reason.as_deref().unwrap_or("");
        assert!(reason.contains("CommitUnknown"), "{reason}");
    }
    // It landed, once; every message is still there.
    let healthy = env.ingestor().await;
    assert_eq!(env.count_rows(healthy.catalog().as_ref()).await, 60);
    assert_eq!(depth(&sqs, &url).await, (0, 3));

    queue.release_all().await;
    let again = healthy.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&again);
    assert_eq!(
        (
            again.messages,
            again.deleted,
            again.already_committed,
            again.replayed
        ),
        (3, 3, 3, 0),
        "{again:#?}"
    );
    assert_eq!(snapshots(&env, &healthy).await, 1, "one commit, never two");
    assert_eq!(env.count_rows(healthy.catalog().as_ref()).await, 60);
    assert_eq!(depth(&sqs, &url).await, (0, 0));
}

/// A delete whose answer is lost, and one that never reached the queue: the first message is
/// gone, the second comes back and is found committed; nothing is ingested twice, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_refused_delete_loses_no_message_and_duplicates_nothing() {
    let env = TestEnv::new("sqlite").await;
    let ingestor = env.ingestor().await;
    let sqs = sqs().await;
    let url = dlq(&sqs).await;
    for i in 0..2 {
        let key = format!("orders/x{i}.jsonl");
        env.put(&key, orders(20, 40 + i)).await;
        send(&sqs, &url, &env.s3_notification(&key, None)).await;
    }
    let queue = TestQueue::with_delete_faults(
        &sqs,
        &url,
        vec![DeleteFault::LostAnswer, DeleteFault::Refused],
    );
    let r = ingestor.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&r);
    assert_eq!(
        (r.messages, r.replayed, r.deleted, r.left),
        (2, 2, 0, 2),
        "{r:#?}"
    );
    assert!(r.items.iter().all(|i| i
        .reason
        .as_deref()
        .is_some_and(|e| e.contains("deleting the message failed"))));
    assert_eq!(
        depth(&sqs, &url).await,
        (0, 1),
        "the lost answer's delete did happen"
    );

    queue.release_all().await;
    let again = ingestor.replay_queue(&queue, &options()).await.unwrap();
    assert_eq!(
        (again.messages, again.deleted, again.already_committed),
        (1, 1, 1),
        "{again:#?}"
    );
    assert_eq!(depth(&sqs, &url).await, (0, 0));
    let catalog = floe::catalog::connect(&env.config).await.unwrap();
    let (rows, _, ids) = env.checksum(catalog.as_ref()).await;
    assert_eq!((rows, ids), (40, 40));
    assert_eq!(snapshots(&env, &ingestor).await, 1);
}

/// The commit lands and the process "crashes" before hearing so (an error after the swap): the
/// outcome is unknown, and the replay's re-read of the table — the ingest path's own duplicate
/// check — finds the object, so its message goes in the same run; the next replay has nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_settled_by_re_reading_the_table() {
    let env = TestEnv::new("sqlite").await;
    let sqs = sqs().await;
    let url = dlq(&sqs).await;
    env.put("orders/c.jsonl", orders(20, 50)).await;
    send(&sqs, &url, &env.s3_notification("orders/c.jsonl", None)).await;
    let crashing = env
        .ingestor_with(crate::faults::faulty(crate::faults::Fault::AfterCommit))
        .await;
    let queue = TestQueue::new(&sqs, &url);
    let r = crashing.replay_queue(&queue, &options()).await.unwrap();
    reconciles(&r);
    assert_eq!(
        (r.messages, r.deleted, r.already_committed),
        (1, 1, 1),
        "{r:#?}"
    );
    let o = &r.items[0].objects[0];
    assert!(
        o.snapshot_id.is_some()
            && o.reason
                .as_deref()
                .is_some_and(|e| e.contains("the table holds the object")),
        "{o:?}"
    );
    assert_eq!(depth(&sqs, &url).await, (0, 0));
    let healthy = env.ingestor().await;
    assert_eq!(env.count_rows(healthy.catalog().as_ref()).await, 20);
    assert_eq!(snapshots(&env, &healthy).await, 1);
}
