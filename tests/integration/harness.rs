//! Shared set-up: one moto_server per test process, a fresh bucket/namespace per test.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use floe::catalog::PointerSwap;
use floe::commit::Committer;
use floe::config::Config;
use floe::event::ObjectRef;
use floe::ingest::{Ingestor, ObjectReport};
use iceberg::Catalog;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn python() -> PathBuf {
    std::env::var("FLOE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target/venv/bin/python"))
}

/// The moto endpoint: `FLOE_TEST_MOTO`, or a server this process starts (and that exits with it).
// The server outlives this function on purpose: it watches our pid and exits with the test process.
#[allow(clippy::zombie_processes)]
pub fn moto() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        if let Ok(e) = std::env::var("FLOE_TEST_MOTO") {
            return e;
        }
        let port_file = std::env::temp_dir().join(format!("floe-moto-{}.port", std::process::id()));
        let _ = std::fs::remove_file(&port_file);
        Command::new(python())
            .arg(repo_root().join("infra/moto_server.py"))
            .args(["--port", "0", "--port-file"])
            .arg(&port_file)
            .args(["--parent-pid", &std::process::id().to_string()])
            .stderr(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect(
                "start moto_server: run `bash infra/test.sh` once to install it into target/venv",
            );
        let start = Instant::now();
        loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                if !p.is_empty() {
                    return format!("http://127.0.0.1:{}", p.trim());
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "moto_server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub async fn s3() -> aws_sdk_s3::Client {
    floe::store::s3_client(&storage()).await
}

pub fn storage() -> floe::config::StorageConfig {
    floe::config::StorageConfig {
        endpoint: Some(moto().to_string()),
        region: Some("us-east-1".into()),
        path_style: true,
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
        local_root: None,
        cache_mb: None,
        request_timeout_seconds: None,
    }
}

/// One test's world: a bucket, a working directory and a config for SQLite or Glue.
#[derive(Clone)]
pub struct TestEnv {
    /// The floe.toml text the config was parsed from.
    pub toml: String,
    pub bucket: String,
    pub namespace: String,
    pub dir: PathBuf,
    pub config: Config,
    pub s3: aws_sdk_s3::Client,
    pub catalog_kind: &'static str,
}

impl TestEnv {
    pub async fn new(catalog_kind: &'static str) -> Self {
        Self::with_orders_toml(catalog_kind, "").await
    }

    /// Like `new`, with extra TOML lines in the `orders` table (e.g. `properties = {...}`).
    pub async fn with_orders_toml(catalog_kind: &'static str, extra: &str) -> Self {
        Self::build(catalog_kind, extra, "").await
    }

    /// Like `new`, with the `orders` table partitioned by `partition` (a TOML array).
    pub async fn with_orders_partition(catalog_kind: &'static str, partition: &str) -> Self {
        let mut env = Self::build(catalog_kind, "", "").await;
        let from = "partition = [\"day(event_time)\"]";
        assert!(
            env.toml.contains(from),
            "the sample orders table's partition changed"
        );
        env.toml = env
            .toml
            .replacen(from, &format!("partition = {partition}"), 1);
        env.config = Config::parse(&env.toml, "test floe.toml").expect("test config");
        env
    }

    /// Like `new`, plus the sample pipelines (and `tail`, more TOML at the end of the config).
    pub async fn with_pipelines(catalog_kind: &'static str, tail: &str) -> Self {
        let toml = format!("{}\n{tail}", floe::sample::PIPELINES_TOML);
        Self::build(catalog_kind, "", &toml).await
    }

    /// The sample pipelines plus extra TOML lines in the `orders` table.
    pub async fn with_pipelines_and_orders_toml(catalog_kind: &'static str, extra: &str) -> Self {
        Self::build(catalog_kind, extra, floe::sample::PIPELINES_TOML).await
    }

    async fn build(catalog_kind: &'static str, extra: &str, tail: &str) -> Self {
        let endpoint = moto();
        let bucket = unique("floe");
        let namespace = unique("ns").replace('-', "_");
        let dir = std::env::temp_dir().join(unique("floe-test"));
        std::fs::create_dir_all(&dir).unwrap();
        let s3 = s3().await;
        s3.create_bucket()
            .bucket(&bucket)
            .send()
            .await
            .expect("create bucket");
        let catalog = match catalog_kind {
            "sqlite" => format!(
                "kind = \"sqlite\"\nuri = \"{}/catalog.db\"\nwarehouse = \"s3://{bucket}/warehouse\"\nnamespace = \"{namespace}\"",
                dir.display()
            ),
                        "rest" => {
                let uri = start_rest_catalog(&dir, &bucket, endpoint);
                format!("kind = \"rest\"\nuri = \"{uri}\"\nwarehouse = \"s3://{bucket}/warehouse\"\nnamespace = \"{namespace}\"")
            }
            _ => format!("kind = \"glue\"\nuri = \"{endpoint}\"\nwarehouse = \"s3://{bucket}/warehouse\"\nnamespace = \"{namespace}\""),
        };
        let text = format!(
            r#"
[catalog]
{catalog}

[storage]
endpoint = "{endpoint}"
region = "us-east-1"
path_style = true
access_key_id = "test"
secret_access_key = "test"

[ingest]
quarantine_prefix = "quarantine/"
chunk_records = 1000
commit_timeout_seconds = 60
max_commit_attempts = 50

[[routes]]
bucket = "{bucket}"
prefix = "orders/"
table = "orders"
format = "jsonl"

[[routes]]
bucket = "{bucket}"
prefix = "csv/"
table = "orders"
format = "csv"

[[routes]]
bucket = "{bucket}"
prefix = "parquet/"
table = "orders"
format = "parquet"

[[routes]]
bucket = "{bucket}"
prefix = "consumer/"
table = "orders_consumer"
format = "jsonl"
{tables}{consumer}{tail}"#,
            tables = floe::sample::ORDERS_TABLE_TOML.replace(
                "target_file_size_mb = 128",
                &format!("target_file_size_mb = 128\n{extra}"),
            ),
            consumer = floe::sample::ORDERS_TABLE_TOML
                .replace("name = \"orders\"", "name = \"orders_consumer\"")
        );
        let config = Config::parse(&text, "test floe.toml").expect("test config");
        Self {
            toml: text,
            bucket,
            namespace,
            dir,
            config,
            s3,
            catalog_kind,
        }
    }

    pub async fn ingestor(&self) -> Ingestor {
        Ingestor::new(self.config.clone()).await.expect("ingestor")
    }

    /// An ingestor whose catalog pointer swap goes through `wrap` (fault injection).
    pub async fn ingestor_with(
        &self,
        wrap: impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap>,
    ) -> Ingestor {
        let catalog = floe::catalog::connect(&self.config).await.expect("catalog");
        let swap = floe::catalog::pointer_swap(&self.config)
            .await
            .expect("swap");
        let store = floe::store::from_config(&self.config.storage).await;
        Ingestor::with_parts(
            self.config.clone(),
            Committer::new(catalog, wrap(swap)),
            store,
        )
        .await
        .expect("ingestor")
    }

    pub async fn put(&self, key: &str, body: impl Into<Vec<u8>>) {
        self.put_version(key, body).await;
    }

    /// Puts `key` and returns S3's answer (its ETag and version id).
    pub async fn put_version(
        &self,
        key: &str,
        body: impl Into<Vec<u8>>,
    ) -> aws_sdk_s3::operation::put_object::PutObjectOutput {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(body.into().into())
            .send()
            .await
            .expect("put object")
    }

    pub async fn get(&self, key: &str) -> Option<Vec<u8>> {
        let out = self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .ok()?;
        Some(out.body.collect().await.ok()?.to_vec())
    }

    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let out = self
            .s3
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .send()
            .await
            .expect("list");
        out.contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect()
    }

    /// One SQS message (as Lambda delivers it) carrying the S3 notification of `key`, with the
    /// ETag the notification names if given.
    pub fn sqs_message(&self, id: &str, key: &str, etag: Option<&str>) -> serde_json::Value {
        serde_json::json!({"messageId": id, "receiptHandle": format!("rh-{id}"),
            "body": self.s3_notification(key, etag), "eventSource": "aws:sqs"})
    }

    /// The S3 notification of `key` (the body of its SQS message, and of its DLQ message), with
    /// the ETag it names if given.
    pub fn s3_notification(&self, key: &str, etag: Option<&str>) -> String {
        let mut object = serde_json::json!({"key": key});
        if let Some(etag) = etag {
            object["eTag"] = serde_json::json!(etag);
        }
        serde_json::json!({"Records": [{"eventSource": "aws:s3",
            "eventName": "ObjectCreated:Put", "eventTime": chrono::Utc::now().to_rfc3339(),
            "s3": {"bucket": {"name": self.bucket}, "object": object}}]})
        .to_string()
    }

    /// The Lambda payload of an SQS batch: one message per key, with ids `m0`, `m1`, ….
    pub fn sqs_batch(&self, keys: &[&str]) -> serde_json::Value {
        let records: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| self.sqs_message(&format!("m{i}"), k, None))
            .collect();
        serde_json::json!({ "Records": records })
    }

    pub fn object(&self, key: &str) -> ObjectRef {
        ObjectRef::new(self.bucket.clone(), key)
    }

    pub async fn ingest(&self, ingestor: &Ingestor, key: &str) -> floe::Result<ObjectReport> {
        ingestor
            .ingest(&self.object(key), Instant::now() + Duration::from_secs(120))
            .await
    }

    /// Ingests `key` on a task of its own with a fresh ingestor, as a separate Lambda would.
    pub async fn spawn_ingest(
        &self,
        key: &str,
    ) -> tokio::task::JoinHandle<floe::Result<ObjectReport>> {
        let ingestor = self.ingestor().await;
        let obj = self.object(key);
        tokio::spawn(async move {
            ingestor
                .ingest(&obj, Instant::now() + Duration::from_secs(120))
                .await
        })
    }

    pub fn ident(&self) -> iceberg::TableIdent {
        floe::catalog::table_ident(&self.config, "orders").unwrap()
    }

    /// A processor (pipelines) over this test's catalog.
    pub async fn processor(&self) -> floe::process::Processor {
        floe::process::Processor::new(self.config.clone())
            .await
            .expect("processor")
    }

    /// A processor whose sink commits go through `wrap` (fault injection).
    pub async fn processor_with(
        &self,
        wrap: impl FnOnce(Arc<dyn PointerSwap>) -> Arc<dyn PointerSwap>,
    ) -> floe::process::Processor {
        let catalog = floe::catalog::connect(&self.config).await.expect("catalog");
        let swap = floe::catalog::pointer_swap(&self.config)
            .await
            .expect("swap");
        floe::process::Processor::with_parts(
            self.config.clone(),
            Committer::new(catalog, wrap(swap)),
        )
    }

    /// A maintainer over this test's catalog.
    pub async fn maintainer(&self) -> floe::maintain::Maintainer {
        floe::maintain::Maintainer::new(self.config.clone())
            .await
            .expect("maintainer")
    }

    /// (rows, sum of customer_id, distinct order ids): an order-independent checksum by full scan.
    pub async fn checksum(&self, catalog: &dyn Catalog) -> (usize, i64, usize) {
        use arrow::array::{Array, Int64Array, StringArray};
        let mut rows = 0;
        let mut sum = 0i64;
        let mut ids = std::collections::HashSet::new();
        for b in &self.scan_all(catalog).await {
            rows += b.num_rows();
            let c = b.column_by_name("customer_id").unwrap();
            let c = c.as_any().downcast_ref::<Int64Array>().unwrap();
            sum += c.iter().flatten().sum::<i64>();
            let o = b.column_by_name("order_id").unwrap();
            let o = o.as_any().downcast_ref::<StringArray>().unwrap();
            ids.extend(o.iter().flatten().map(str::to_string));
        }
        (rows, sum, ids.len())
    }

    /// Rows in the table by a full scan through iceberg-rust.
    pub async fn count_rows(&self, catalog: &dyn Catalog) -> usize {
        self.scan_all(catalog)
            .await
            .iter()
            .map(|b| b.num_rows())
            .sum()
    }

    /// Every row of `orders`, by a full scan through iceberg-rust.
    pub async fn scan_all(&self, catalog: &dyn Catalog) -> Vec<arrow::array::RecordBatch> {
        use futures::TryStreamExt;
        let table = catalog.load_table(&self.ident()).await.expect("load");
        if table.metadata().current_snapshot().is_none() {
            return Vec::new();
        }
        let scan = table.scan().build().expect("scan");
        scan.to_arrow()
            .await
            .expect("arrow")
            .try_collect()
            .await
            .expect("read")
    }

    /// Runs Python `code` with `t` bound to `table` loaded through PyIceberg's SQL catalog over
    /// this test's SQLite catalog: another engine writing the same table.
    pub fn pyiceberg_run(&self, table: &str, code: &str) {
        self.pyiceberg_runner(table, code)();
    }

    /// [`TestEnv::pyiceberg_run`] to run later (in a race, say), without the environment.
    pub fn pyiceberg_runner(&self, table: &str, code: &str) -> impl FnOnce() + Send + 'static {
        // On REST, the server's own SQL catalog, written directly (its compare-and-swap is the
        // server's too).
        let (name, db) = match self.catalog_kind {
            "rest" => ("rest", "rest.db"),
            _ => ("floe", "catalog.db"),
        };
        let script = format!(
            r#"
from pyiceberg.catalog.sql import SqlCatalog
cat = SqlCatalog("{name}", uri="sqlite:///{dir}/{db}", warehouse="s3://{bucket}/warehouse",
    **{{"s3.endpoint": "{endpoint}", "s3.access-key-id": "test", "s3.secret-access-key": "test",
        "s3.region": "us-east-1"}})
t = cat.load_table("{ns}.{table}")
{code}
"#,
            dir = self.dir.display(),
            bucket = self.bucket,
            endpoint = moto(),
            ns = self.namespace,
        );
        move || {
            let out = Command::new(python())
                .args(["-c", &script])
                .output()
                .expect("run python");
            assert!(
                out.status.success(),
                "pyiceberg: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Reads the table with PyIceberg and returns its JSON report.
    pub fn pyiceberg(&self) -> serde_json::Value {
        self.pyiceberg_table("orders")
    }

    /// Reads `table` (in this test's namespace) with PyIceberg and returns its JSON report.
    pub fn pyiceberg_table(&self, table: &str) -> serde_json::Value {
        self.pyiceberg_report(table, false)
    }

    /// [`TestEnv::pyiceberg_table`] with every row (`data`: values as text, sorted).
    pub fn pyiceberg_rows(&self, table: &str) -> serde_json::Value {
        self.pyiceberg_report(table, true)
    }

    /// Reads the table version at `metadata` (a metadata.json) with DuckDB's iceberg extension:
    /// `{"rows": n, "data": [...]}` for `columns` (values as text, sorted).
    pub fn duckdb_rows(&self, metadata: &str, columns: &str) -> serde_json::Value {
        let out = Command::new(python())
            .arg(repo_root().join("infra/duckdb_check.py"))
            .args([
                "--metadata",
                metadata,
                "--endpoint",
                moto(),
                "--columns",
                columns,
            ])
            .output()
            .expect("run python");
        assert!(
            out.status.success(),
            "duckdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("duckdb json")
    }

    fn pyiceberg_report(&self, table: &str, rows: bool) -> serde_json::Value {
        let mut cmd = Command::new(python());
        cmd.arg(repo_root().join("infra/pyiceberg_check.py"));
        if rows {
            cmd.arg("--rows");
        }
        let kind = if self.catalog_kind == "glue" {
            "glue"
        } else {
            "sqlite"
        };
        cmd.args([
            "--catalog",
            kind,
            "--table",
            &format!("{}.{table}", self.namespace),
        ])
        .args(["--endpoint", moto()]);
        match self.catalog_kind {
            "sqlite" => {
                cmd.args([
                    "--uri",
                    &format!("sqlite:///{}/catalog.db", self.dir.display()),
                ]);
            }
            "rest" => {
                // The REST server's own SQL catalog, read directly by PyIceberg.
                cmd.args([
                    "--uri",
                    &format!("sqlite:///{}/rest.db", self.dir.display()),
                ])
                .args(["--catalog-name", "rest"]);
            }
            _ => {}
        }
        if kind == "sqlite" {
            cmd.args(["--warehouse", &format!("s3://{}/warehouse", self.bucket)]);
        }
        let out = cmd.output().expect("run python");
        assert!(
            out.status.success(),
            "pyiceberg failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("pyiceberg json")
    }
}

/// Starts `infra/rest_catalog.py` (an Iceberg REST catalog over PyIceberg's SQL catalog) for one
/// test; it exits with the test process. Returns its URI.
#[allow(clippy::zombie_processes)] // reaped by a thread once started; exits with the test process
fn start_rest_catalog(dir: &std::path::Path, bucket: &str, s3: &str) -> String {
    let port_file = dir.join("rest.port");
    let log = std::fs::File::create(dir.join("rest.log")).expect("rest log");
    let mut child = Command::new(python())
        .arg(repo_root().join("infra/rest_catalog.py"))
        .arg("--db")
        .arg(dir.join("rest.db"))
        .args([
            "--warehouse",
            &format!("s3://{bucket}/warehouse"),
            "--s3-endpoint",
            s3,
        ])
        .arg("--port-file")
        .arg(&port_file)
        .args(["--parent-pid", &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the REST catalog");
    let start = Instant::now();
    loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            if !p.is_empty() {
                // It watches our pid and exits with us; reap it on a thread meanwhile.
                std::thread::spawn(move || child.wait());
                return format!("http://127.0.0.1:{}", p.trim());
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "REST catalog did not start: see {}/rest.log",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// JSON lines of `n` orders.
pub fn orders(n: usize, seed: u64) -> String {
    floe::sample::orders_jsonl(n, seed, chrono::Utc::now())
}
