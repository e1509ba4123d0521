//! Order-like sample events for the demo, the benchmark and the tests (deterministic per seed).

use std::fmt::Write as _;

use chrono::{DateTime, Duration, Utc};

/// The `floe.toml` table section matching [`order_line`]'s fields.
pub const ORDERS_TABLE_TOML: &str = r#"
[[tables]]
name = "orders"
event_time = "event_time"
partition = ["day(event_time)"]
target_file_size_mb = 128
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "customer_id", type = "long", required = true },
  { name = "region", type = "string" },
  { name = "amount", type = "double" },
  { name = "currency", type = "string" },
  { name = "items", type = "int" },
  { name = "status", type = "string" },
  { name = "payment_method", type = "string" },
  { name = "event_time", type = "timestamptz", required = true },
]
"#;

/// Two pipelines over `orders` for the demo and the tests: an `append` transform flagging
/// suspicious orders, and revenue per region per minute (`aggregate`, late events included).
pub const PIPELINES_TOML: &str = r#"
[[pipelines]]
name = "suspicious_orders"
source = "orders"
sink = "suspicious_orders"
mode = "append"
keys = ["order_id"]
sql = """
SELECT order_id, customer_id, region, amount, payment_method, event_time,
       CASE WHEN amount >= 4900 THEN 'very large order' ELSE 'large voucher payment' END AS reason
FROM source
WHERE amount >= 4900 OR (payment_method = 'voucher' AND amount >= 4000)
"""

[[pipelines]]
name = "revenue_per_region_minute"
source = "orders"
sink = "revenue_per_region_minute"
mode = "aggregate"
window = "1m"
keys = ["window_start", "region"]
sql = """
SELECT window_start, region, count(*) AS orders, sum(amount) AS revenue
FROM source
GROUP BY window_start, region
"""
"#;

/// A latest-state pipeline over `orders`: each customer's latest order (by event time, late
/// events included), a cancelled latest order removing the customer (`delete_when`).
pub const LATEST_PIPELINE_TOML: &str = r#"
[[pipelines]]
name = "customer_latest_order"
source = "orders"
sink = "customer_latest_order"
mode = "latest"
keys = ["customer_id"]
order_by = "event_time"
delete_when = "status = 'cancelled'"
sql = """
SELECT customer_id, order_id, status, amount, region, event_time
FROM source
"""
"#;

/// The sample orders' regions.
pub const REGIONS: [&str; 5] = ["eu-west", "us-east", "us-west", "ap-south", "sa-east"];
/// The sample orders' currencies.
pub const CURRENCIES: [&str; 4] = ["EUR", "USD", "GBP", "JPY"];
/// The sample orders' statuses.
pub const STATUSES: [&str; 4] = ["placed", "paid", "shipped", "cancelled"];
/// The sample orders' payment methods.
pub const PAYMENTS: [&str; 4] = ["card", "paypal", "bank_transfer", "voucher"];

/// A small deterministic PRNG (xorshift64*), so samples need no extra crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A random (version 4) UUID drawn from `rng`, as text.
pub fn uuid_v4(rng: &mut Rng) -> String {
    let (a, b) = (rng.next_u64(), rng.next_u64());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Appends one order event as a JSON line. `lateness_s` moves the event time into the past.
pub fn order_line(out: &mut String, rng: &mut Rng, base: DateTime<Utc>, lateness_s: i64) {
    let id = uuid_v4(rng);
    let t = base - Duration::milliseconds(rng.below(60_000) as i64) - Duration::seconds(lateness_s);
    let amount = (rng.below(500_000) as f64) / 100.0;
    let _ = writeln!(
        out,
        r#"{{"order_id":"{id}","customer_id":{},"region":"{}","amount":{amount:.2},"currency":"{}","items":{},"status":"{}","payment_method":"{}","event_time":"{}"}}"#,
        rng.below(1_000_000),
        REGIONS[rng.below(5) as usize],
        CURRENCIES[rng.below(4) as usize],
        1 + rng.below(9),
        STATUSES[rng.below(4) as usize],
        PAYMENTS[rng.below(4) as usize],
        t.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
    );
}

/// `n` order lines as one JSON-lines text.
pub fn orders_jsonl(n: usize, seed: u64, base: DateTime<Utc>) -> String {
    let mut rng = Rng::new(seed);
    let mut s = String::with_capacity(n * 240);
    for _ in 0..n {
        order_line(&mut s, &mut rng, base, 0);
    }
    s
}

/// `n` order lines whose event times lie `lateness_s` seconds (plus up to a minute) in the past.
pub fn late_orders_jsonl(n: usize, seed: u64, base: DateTime<Utc>, lateness_s: i64) -> String {
    let mut rng = Rng::new(seed);
    let mut s = String::with_capacity(n * 240);
    for _ in 0..n {
        order_line(&mut s, &mut rng, base, lateness_s);
    }
    s
}

/// gzip-compresses bytes (fast level).
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_with_all_fields() {
        let text = orders_jsonl(3, 7, Utc::now());
        assert_eq!(text.lines().count(), 3);
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            for f in ["order_id", "customer_id", "region", "amount", "event_time"] {
                assert!(v.get(f).is_some(), "{f} in {l}");
            }
        }
        let base = Utc::now();
        assert_eq!(orders_jsonl(5, 9, base), orders_jsonl(5, 9, base));
        assert_ne!(orders_jsonl(5, 9, base), orders_jsonl(5, 10, base));
    }
}
