//! Plain-text tables and figures for the client commands: columns sized to
//! their widest cell, the last one cut to the terminal's width; ages,
//! durations and token counts written short.

use warden::config::settings;

/// Width assumed when neither `COLUMNS` nor the terminal says one.
const FALLBACK_WIDTH: usize = 100;
/// Narrowest the last column is cut to, however narrow the terminal.
const MIN_LAST_COLUMN: usize = 12;

/// The terminal's width: `COLUMNS` when set, else the terminal stdout is,
/// else [`FALLBACK_WIDTH`].
pub fn terminal_width() -> usize {
    let columns = settings::process_env()
        .get("COLUMNS")
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|c| (10..=1000).contains(c));
    columns
        .or_else(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
        .unwrap_or(FALLBACK_WIDTH)
}

/// `text` cut to `width` characters, with `…` when cut; control
/// characters (a goal's newlines) as spaces.
pub fn fit(text: &str, width: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.chars().count() <= width {
        return clean;
    }
    let mut cut: String = clean.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `rows` under `headers`, columns two spaces apart, the last cut so that a
/// line fits in `width`.
pub fn render(headers: &[&str], rows: &[Vec<String>], width: usize) -> String {
    let count = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(count) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let before = widths_before(&widths);
    if let Some(last) = widths.last_mut() {
        *last = (*last).min(width.saturating_sub(before).max(MIN_LAST_COLUMN));
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{:<w$}", fit(cell, *w), w = *w))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The width the columns but the last take, with their gaps.
fn widths_before(widths: &[usize]) -> usize {
    widths[..widths.len().saturating_sub(1)]
        .iter()
        .map(|w| w + 2)
        .sum()
}

/// A count of tokens written short: `950`, `12.3k`, `4.5M`.
pub fn tokens(n: i64) -> String {
    let abs = n.unsigned_abs();
    if abs < 1_000 {
        n.to_string()
    } else if abs < 1_000_000 {
        format!("{:.1}k", n as f64 / 1e3)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

/// Seconds written short: `42s`, `3m05s`, `2h10m`, `3d4h`.
pub fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3_600, s % 3_600 / 60),
        s => format!("{}d{}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// How long ago `at` (RFC 3339) was, written short; `?` if unreadable.
pub fn age(at: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> String {
    at.and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map(|at| {
            let secs = (now - at.with_timezone(&chrono::Utc)).num_seconds();
            duration(u64::try_from(secs).unwrap_or(0))
        })
        .unwrap_or_else(|| "?".into())
}

/// A bar of `width` cells, `fraction` (0–1) of them filled.
pub fn bar(fraction: f64, width: usize) -> String {
    let filled = (fraction.clamp(0.0, 1.0) * width as f64).round() as usize;
    format!(
        "[{}{}]",
        "#".repeat(filled),
        ".".repeat(width - filled.min(width))
    )
}
