//! The type names and partition expressions a `floe.toml` may use, parsed into Iceberg terms.

use std::collections::HashSet;

use iceberg::spec::{PrimitiveType, Transform};

/// Parses a config type name into an Iceberg primitive type.
pub(crate) fn parse_type(name: &str) -> std::result::Result<PrimitiveType, String> {
    let n = name.trim().to_ascii_lowercase();
    Ok(match n.as_str() {
        "string" => PrimitiveType::String,
        "int" | "integer" => PrimitiveType::Int,
        "long" | "bigint" => PrimitiveType::Long,
        "float" => PrimitiveType::Float,
        "double" => PrimitiveType::Double,
        "boolean" | "bool" => PrimitiveType::Boolean,
        "date" => PrimitiveType::Date,
        "timestamp" => PrimitiveType::Timestamp,
        "timestamptz" => PrimitiveType::Timestamptz,
        _ => {
            if let Some(args) = n.strip_prefix("decimal(").and_then(|r| r.strip_suffix(')')) {
                let (p, s) = args
                    .split_once(',')
                    .ok_or_else(|| format!("`{name}`: expected decimal(P,S)"))?;
                let precision: u32 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{name}`: bad precision"))?;
                let scale: u32 = s
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{name}`: bad scale"))?;
                if precision == 0 || precision > 38 || scale > precision {
                    return Err(format!(
                        "`{name}`: precision must be 1..=38 and scale <= precision"
                    ));
                }
                PrimitiveType::Decimal { precision, scale }
            } else {
                return Err(format!(
                    "unknown type `{name}`; expected string, int, long, float, double, boolean, date, timestamp, timestamptz or decimal(P,S)"
                ));
            }
        }
    })
}

/// Parses a partition expression (`day(col)`, `hour(col)`, `month(col)`, `year(col)`,
/// `identity(col)` or `col`, `bucket(N, col)`, `truncate(W, col)`) into a transform and column.
pub(crate) fn parse_partition(
    expr: &str,
    columns: &HashSet<&str>,
) -> std::result::Result<(Transform, String), String> {
    let e = expr.trim();
    let (transform, col) = match e.split_once('(') {
        None => (Transform::Identity, e.to_string()),
        Some((func, rest)) => {
            let args = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("`{expr}`: missing `)`"))?;
            let func = func.trim().to_ascii_lowercase();
            match func.as_str() {
                "identity" => (Transform::Identity, args.trim().to_string()),
                "year" | "years" => (Transform::Year, args.trim().to_string()),
                "month" | "months" => (Transform::Month, args.trim().to_string()),
                "day" | "days" => (Transform::Day, args.trim().to_string()),
                "hour" | "hours" => (Transform::Hour, args.trim().to_string()),
                "bucket" | "truncate" => {
                    let (n, c) = args
                        .split_once(',')
                        .ok_or_else(|| format!("`{expr}`: expected {func}(N, column)"))?;
                    let n: u32 = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("`{expr}`: N must be a positive integer"))?;
                    if n == 0 {
                        return Err(format!("`{expr}`: N must be a positive integer"));
                    }
                    let t = if func == "bucket" {
                        Transform::Bucket(n)
                    } else {
                        Transform::Truncate(n)
                    };
                    (t, c.trim().to_string())
                }
                other => return Err(format!("`{expr}`: unknown transform `{other}`")),
            }
        }
    };
    if !columns.contains(col.as_str()) {
        return Err(format!("`{expr}`: no column named `{col}`"));
    }
    Ok((transform, col))
}
