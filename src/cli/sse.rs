//! Server-Sent Events read from a byte stream: bytes in, whole frames out
//! (`id`, `event`, `data`), however the chunks cut them.

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// Its `id:` (a session log's sequence number), if it had one.
    pub id: Option<String>,
    /// Its `event:` (the event kind), if it had one.
    pub event: Option<String>,
    /// Its `data:` lines, joined by newlines.
    pub data: String,
}

/// Longest frame held while it is incomplete: a stream that sends more
/// without a blank line is not an event stream.
const MAX_FRAME_BYTES: usize = 8 << 20;

/// The bytes read but not yet a whole frame.
#[derive(Debug, Default)]
pub struct Parser {
    pending: Vec<u8>,
}

impl Parser {
    /// Takes `chunk`; returns the frames it completed, or an error when a
    /// frame grows past [`MAX_FRAME_BYTES`].
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, String> {
        self.pending.extend_from_slice(chunk);
        let mut frames = Vec::new();
        while let Some((end, gap)) = frame_end(&self.pending) {
            let raw: Vec<u8> = self.pending.drain(..end + gap).take(end).collect();
            if let Some(frame) = parse_frame(&String::from_utf8_lossy(&raw)) {
                frames.push(frame);
            }
        }
        if self.pending.len() > MAX_FRAME_BYTES {
            return Err(format!("an event is over {MAX_FRAME_BYTES} bytes"));
        }
        Ok(frames)
    }
}

/// Where the first frame ends (the blank line) and how long the blank is.
fn frame_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let lf = find(bytes, b"\n\n").map(|at| (at, 2));
    let crlf = find(bytes, b"\r\n\r\n").map(|at| (at, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A frame's fields; `None` for one with no data (a comment, a keep-alive).
fn parse_frame(text: &str) -> Option<Frame> {
    let mut frame = Frame::default();
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => frame.id = Some(value.to_string()),
            "event" => frame.event = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() {
        return None;
    }
    frame.data = data.join("\n");
    Some(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_cut_anywhere_come_out_whole() {
        let stream = b": keep-alive\n\nid: 1\nevent: a\ndata: {\"x\":1}\n\nid: 2\r\nevent: b\r\ndata: one\r\ndata: two\r\n\r\n";
        for cut in 0..stream.len() {
            let mut parser = Parser::default();
            let mut frames = parser.push(&stream[..cut]).unwrap();
            frames.extend(parser.push(&stream[cut..]).unwrap());
            assert_eq!(frames.len(), 2, "cut at {cut}");
            assert_eq!(frames[0].id.as_deref(), Some("1"));
            assert_eq!(frames[0].event.as_deref(), Some("a"));
            assert_eq!(frames[0].data, "{\"x\":1}");
            assert_eq!(frames[1].data, "one\ntwo");
        }
    }

    #[test]
    fn a_frame_that_never_ends_is_refused() {
        let mut parser = Parser::default();
        let big = vec![b'x'; MAX_FRAME_BYTES + 1];
        assert!(parser.push(&big).is_err());
    }

    #[test]
    fn a_frame_without_an_id_has_none() {
        let mut parser = Parser::default();
        let frames = parser.push(b"event: gap\ndata: {}\n\n").unwrap();
        assert_eq!(frames[0].id, None);
        assert_eq!(frames[0].event.as_deref(), Some("gap"));
    }
}
