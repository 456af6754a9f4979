//! Old kubelets' `:authority`: kubelet before 1.26 dials a plugin's socket by its bare path with
//! grpc-go, which then sends that path (`/var/lib/kubelet/plugins_registry/x-reg.sock`) as the
//! HTTP/2 `:authority` of every call, on the registration socket and on the CSI socket alike
//! (kubernetes#108254; kubelet sends `localhost` from 1.26 on, kubernetes#112597). h2, under
//! tonic, refuses a request whose authority is not `host[:port]` with PROTOCOL_ERROR before any
//! service sees it, so such a kubelet could neither register the plugin nor call it (measured with
//! kubelet 1.20.2: "RegisterPlugin error -- failed to get plugin info using RPC GetInfo").
//!
//! [`Rewriting`] wraps each accepted connection and, in what the client sends, rewrites a literal
//! `:authority` field of a HEADERS frame whose value h2 would refuse into a value of **the same
//! length** in which every byte other than `A-Z a-z 0-9 - . _ ~` is `_` (so
//! `/var/lib/kubelet/x.sock` becomes `_var_lib_kubelet_x.sock`), sent without Huffman coding. The
//! same length keeps the HPACK dynamic tables of client and server the same size (an entry's size
//! is its name's and value's lengths plus 32), so every later index the client sends still names
//! the same entry in h2's table, and an indexed reference to the rewritten entry yields the valid
//! value. Nothing else is changed: a valid authority, every other field and frame, and everything
//! the server sends pass through as they are. flexvol routes by the request's path only; the
//! authority is never read.
//!
//! **Bounds.** The connection preface and frame headers are parsed from at most one frame's bytes
//! (HEADERS frames held whole up to [`MAX_HEADERS`]; any other frame's payload is passed on as it
//! arrives); a HEADERS frame that ends without END_HEADERS (its block continues in CONTINUATION
//! frames), a malformed block, or a HEADERS frame larger than the bound is passed through
//! unchanged, and h2 judges it as before. A client that does not start with the HTTP/2 preface
//! gets everything passed through.

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest HEADERS frame held to be rewritten (a kubelet's call sends a few hundred bytes);
/// a larger one is passed through unchanged.
pub(crate) const MAX_HEADERS: usize = 16 * 1024;
const FRAME_HEADER: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// `:authority`'s index in HPACK's static table.
const AUTHORITY_INDEX: u64 = 1;

/// Where the reader is in the client's byte stream.
enum State {
    /// Before the preface: how many of its bytes matched so far.
    Preface,
    /// At a frame header.
    Frame,
    /// Inside a frame that is passed through: how many payload bytes are left.
    Skip(usize),
    /// Not HTTP/2 as expected: everything passes through.
    Through,
}

/// A connection whose client-to-server bytes have a refused `:authority` rewritten (module doc).
pub(crate) struct Rewriting<S> {
    inner: S,
    state: State,
    /// Bytes read from `inner` and not yet judged.
    pending: Vec<u8>,
    /// Bytes judged and not yet handed to the reader.
    out: Vec<u8>,
    /// How many authorities were rewritten (for the log and the tests).
    pub(crate) rewritten: usize,
    eof: bool,
}

impl<S> Rewriting<S> {
    pub(crate) fn new(inner: S) -> Self {
        Rewriting {
            inner,
            state: State::Preface,
            pending: Vec::new(),
            out: Vec::new(),
            rewritten: 0,
            eof: false,
        }
    }

    /// Moves what can be judged from `pending` to `out`.
    fn judge(&mut self) {
        loop {
            match self.state {
                State::Through => {
                    self.out.append(&mut self.pending);
                    return;
                }
                State::Preface => {
                    let n = self.pending.len().min(PREFACE.len());
                    if self.pending[..n] != PREFACE[..n] {
                        self.state = State::Through;
                        continue;
                    }
                    if n < PREFACE.len() {
                        if self.eof {
                            self.state = State::Through;
                            continue;
                        }
                        return;
                    }
                    self.out.extend(self.pending.drain(..PREFACE.len()));
                    self.state = State::Frame;
                }
                State::Skip(left) => {
                    let n = left.min(self.pending.len());
                    self.out.extend(self.pending.drain(..n));
                    if n == left {
                        self.state = State::Frame;
                    } else {
                        self.state = State::Skip(left - n);
                        return;
                    }
                }
                State::Frame => {
                    if self.pending.len() < FRAME_HEADER {
                        if self.eof {
                            self.state = State::Through;
                            continue;
                        }
                        return;
                    }
                    let h = &self.pending[..FRAME_HEADER];
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let (kind, flags) = (h[3], h[4]);
                    let whole =
                        kind == TYPE_HEADERS && flags & FLAG_END_HEADERS != 0 && len <= MAX_HEADERS;
                    if !whole {
                        self.out.extend(self.pending.drain(..FRAME_HEADER));
                        self.state = State::Skip(len);
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER + len {
                        if self.eof {
                            self.state = State::Through;
                            continue;
                        }
                        return;
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
                    match rewrite_headers_frame(&frame) {
                        Some(f) => {
                            self.rewritten += 1;
                            self.out.extend_from_slice(&f);
                        }
                        None => self.out.extend_from_slice(&frame),
                    }
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewriting<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.pending.extend_from_slice(rb.filled());
                    }
                    this.judge();
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewriting<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S> tonic::transport::server::Connected for Rewriting<S> {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// A whole HEADERS frame (header and payload, END_HEADERS set) with its refused `:authority`
/// rewritten, or `None` when nothing needs to change or the frame cannot be read.
fn rewrite_headers_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let (head, payload) = frame.split_at(FRAME_HEADER);
    let flags = head[4];
    let mut at = 0usize;
    let pad = if flags & FLAG_PADDED != 0 {
        at = 1;
        usize::from(*payload.first()?)
    } else {
        0
    };
    if flags & FLAG_PRIORITY != 0 {
        at += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    if at > end {
        return None;
    }
    let block = rewrite_block(&payload[at..end])?;
    let mut p = Vec::with_capacity(at + block.len() + pad);
    p.extend_from_slice(&payload[..at]);
    p.extend_from_slice(&block);
    p.extend_from_slice(&payload[end..]);
    let len = u32::try_from(p.len()).ok().filter(|&l| l < 1 << 24)?;
    let mut f = Vec::with_capacity(FRAME_HEADER + p.len());
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.extend_from_slice(&head[3..]);
    f.extend_from_slice(&p);
    Some(f)
}

/// An HPACK integer with an `n`-bit prefix at the start of `b`: its value and length in bytes.
fn int(b: &[u8], n: u32) -> Option<(u64, usize)> {
    let mask = (1u16 << n) - 1;
    let first = u16::from(*b.first()?) & mask;
    if first < mask {
        return Some((u64::from(first), 1));
    }
    let mut v = u64::from(mask);
    let mut shift = 0u32;
    for (i, &c) in b.iter().enumerate().skip(1) {
        if shift > 56 {
            return None;
        }
        v += u64::from(c & 0x7f) << shift;
        shift += 7;
        if c & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// `v` as an HPACK integer with an `n`-bit prefix, the prefix's other bits `high`.
fn put_int(out: &mut Vec<u8>, v: u64, n: u32, high: u8) {
    let mask = (1u64 << n) - 1;
    if v < mask {
        out.push(high | u8::try_from(v).unwrap_or(0));
        return;
    }
    out.push(high | u8::try_from(mask).unwrap_or(0));
    let mut r = v - mask;
    while r >= 0x80 {
        out.push(u8::try_from(r & 0x7f).unwrap_or(0) | 0x80);
        r >>= 7;
    }
    out.push(u8::try_from(r).unwrap_or(0));
}

/// A string literal at the start of `b`: (Huffman-coded, its bytes, its whole length).
fn string(b: &[u8]) -> Option<(bool, &[u8], usize)> {
    let huffman = *b.first()? & 0x80 != 0;
    let (len, n) = int(b, 7)?;
    let len = usize::try_from(len).ok()?;
    let s = b.get(n..n.checked_add(len)?)?;
    Some((huffman, s, n + len))
}

/// The header block with a refused literal `:authority` value rewritten, or `None` when there
/// is none (or the block cannot be read).
fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len() + 16);
    let mut changed = false;
    let mut i = 0usize;
    while i < block.len() {
        let b = block[i];
        let prefix = if b & 0x80 != 0 {
            // Indexed field: nothing to rewrite.
            let (_, n) = int(&block[i..], 7)?;
            out.extend_from_slice(&block[i..i + n]);
            i += n;
            continue;
        } else if b & 0x40 != 0 {
            6 // literal with incremental indexing
        } else if b & 0x20 != 0 {
            // Dynamic table size update.
            let (_, n) = int(&block[i..], 5)?;
            out.extend_from_slice(&block[i..i + n]);
            i += n;
            continue;
        } else {
            4 // literal without indexing, or never indexed
        };
        let start = i;
        let (index, n) = int(&block[i..], prefix)?;
        i += n;
        if index == 0 {
            let (_, _, n) = string(&block[i..])?;
            i += n;
        }
        let value_at = i;
        let (huffman, value, n) = string(&block[i..])?;
        i += n;
        if index == AUTHORITY_INDEX {
            let decoded = if huffman {
                huffman_decode(value)?
            } else {
                value.to_vec()
            };
            if !valid_authority(&decoded) && !decoded.is_empty() {
                out.extend_from_slice(&block[start..value_at]);
                let fixed = sanitize(&decoded);
                put_int(&mut out, u64::try_from(fixed.len()).ok()?, 7, 0);
                out.extend_from_slice(&fixed);
                changed = true;
                continue;
            }
        }
        out.extend_from_slice(&block[start..i]);
    }
    changed.then_some(out)
}

/// Whether h2 accepts `v` as a request's authority.
fn valid_authority(v: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(v).is_ok()
}

/// `v` with every byte other than `A-Z a-z 0-9 - . _ ~` replaced by `_` (same length).
fn sanitize(v: &[u8]) -> Vec<u8> {
    v.iter()
        .map(|&c| {
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                c
            } else {
                b'_'
            }
        })
        .collect()
}

/// The bit length of each symbol's code in HPACK's Huffman code (RFC 7541, Appendix B), symbols
/// 0-255; EOS (256) is 30 bits of ones. The code is canonical: codes are given in order of length,
/// then of symbol, so the lengths define it.
const HUFFMAN_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

/// (length, code) -> symbol, built once from [`HUFFMAN_LENGTHS`].
fn huffman_codes() -> &'static std::collections::HashMap<(u8, u32), u8> {
    static CODES: OnceLock<std::collections::HashMap<(u8, u32), u8>> = OnceLock::new();
    CODES.get_or_init(|| {
        let mut syms: Vec<u8> = (0..=255u8).collect();
        syms.sort_by_key(|&s| (HUFFMAN_LENGTHS[usize::from(s)], s));
        let mut map = std::collections::HashMap::with_capacity(256);
        let mut code = 0u32;
        let mut prev = 0u8;
        for (k, &s) in syms.iter().enumerate() {
            let len = HUFFMAN_LENGTHS[usize::from(s)];
            if k > 0 {
                code += 1;
                code <<= len - prev;
            }
            prev = len;
            map.insert((len, code), s);
        }
        map
    })
}

/// Decodes an HPACK Huffman string; `None` when it is not a valid one (a code not in the table,
/// EOS, or padding longer than 7 bits or not all ones).
fn huffman_decode(b: &[u8]) -> Option<Vec<u8>> {
    let codes = huffman_codes();
    let mut out = Vec::with_capacity(b.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for &byte in b {
        for bit in (0..8).rev() {
            code = code << 1 | u32::from(byte >> bit & 1);
            len += 1;
            if len >= 5
                && let Some(&s) = codes.get(&(len, code))
            {
                out.push(s);
                code = 0;
                len = 0;
            }
            if len > 30 {
                return None;
            }
        }
    }
    // What is left is padding: at most 7 bits, all ones.
    (len <= 7 && code == (1u32 << len) - 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// HPACK Huffman encoding (the tests' client side).
    fn huffman_encode(s: &[u8]) -> Vec<u8> {
        let mut rev = std::collections::HashMap::new();
        for (&(len, code), &sym) in huffman_codes() {
            rev.insert(sym, (len, code));
        }
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for c in s {
            let (len, code) = rev[c];
            acc = acc << len | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                out.push(u8::try_from(acc >> (bits - 8) & 0xff).unwrap());
                bits -= 8;
            }
        }
        if bits > 0 {
            let pad = 8 - bits;
            out.push(u8::try_from((acc << pad | ((1 << pad) - 1)) & 0xff).unwrap());
        }
        out
    }

    /// A header block as grpc-go sends a call's first headers: `:method POST` (indexed 3),
    /// `:scheme http` (indexed 6), `:path` (literal, incremental, name index 4), `:authority`
    /// (literal, incremental, name index 1, Huffman), `content-type` literal.
    fn grpc_go_block(authority: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x86];
        b.push(0x44);
        put_int(&mut b, 32, 7, 0);
        b.extend_from_slice(b"/pluginregistration.Registration/GetInfo"[..32].as_ref());
        b.push(0x41);
        let h = huffman_encode(authority);
        put_int(&mut b, u64::try_from(h.len()).unwrap(), 7, 0x80);
        b.extend_from_slice(&h);
        b.push(0x5f); // content-type, name index 31, incremental
        put_int(&mut b, 16, 7, 0);
        b.extend_from_slice(b"application/grpc");
        b
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let l = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![l[1], l[2], l[3], kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    /// Decodes a block back into (name index or literal name, value) pairs, literals only.
    fn authority_of(block: &[u8]) -> Vec<u8> {
        let mut i = 0;
        while i < block.len() {
            let b = block[i];
            if b & 0x80 != 0 {
                i += int(&block[i..], 7).unwrap().1;
                continue;
            }
            let p = if b & 0x40 != 0 { 6 } else { 4 };
            let (idx, n) = int(&block[i..], p).unwrap();
            i += n;
            let (h, v, n) = string(&block[i..]).unwrap();
            i += n;
            if idx == 1 {
                return if h {
                    huffman_decode(v).unwrap()
                } else {
                    v.to_vec()
                };
            }
        }
        panic!("no :authority")
    }

    #[test]
    fn huffman_round_trips_and_rejects_bad_padding() {
        let s = b"/var/lib/kubelet/plugins_registry/hostpath.csi.flexvol.io-reg.sock";
        let h = huffman_encode(s);
        assert!(h.len() < s.len());
        assert_eq!(huffman_decode(&h).unwrap(), s);
        // RFC 7541 C.4.1: "www.example.com".
        let rfc = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(huffman_decode(&rfc).unwrap(), b"www.example.com");
        // Padding of zeros, or a whole byte of padding, is refused.
        assert_eq!(huffman_encode(b"a"), [0x1f]); // 00011, then 111
        assert_eq!(huffman_decode(&[0x1f]).unwrap(), b"a");
        assert!(huffman_decode(&[0x18]).is_none()); // 00011, then 000
        assert!(huffman_decode(&[0xff]).is_none());
    }

    #[test]
    fn a_socket_path_authority_is_rewritten_to_a_valid_one_of_the_same_length() {
        let path = b"/var/lib/kubelet/plugins_registry/hostpath.csi.flexvol.io-reg.sock";
        assert!(!valid_authority(path));
        let block = grpc_go_block(path);
        let out = rewrite_block(&block).expect("rewritten");
        let a = authority_of(&out);
        assert_eq!(
            a.len(),
            path.len(),
            "same length: the HPACK tables stay in step"
        );
        assert_eq!(
            a,
            b"_var_lib_kubelet_plugins_registry_hostpath.csi.flexvol.io-reg.sock"
        );
        assert!(valid_authority(&a));
        // Everything else is as it was.
        assert_eq!(out[..2], block[..2]);
        assert!(out.ends_with(b"application/grpc"));
        // A valid authority (kubelet 1.26 and later send "localhost") is left alone.
        assert!(rewrite_block(&grpc_go_block(b"localhost")).is_none());
    }

    #[test]
    fn padded_and_priority_frames_keep_their_padding_and_priority() {
        let block = grpc_go_block(b"/run/x.sock");
        let mut payload = vec![3u8, 0, 0, 0, 0, 16];
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0, 0]);
        let f = frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
            &payload,
        );
        let out = rewrite_headers_frame(&f).unwrap();
        let len = usize::from(out[0]) << 16 | usize::from(out[1]) << 8 | usize::from(out[2]);
        assert_eq!(len, out.len() - FRAME_HEADER);
        assert_eq!(out[3..9], f[3..9]);
        assert_eq!(out[9..15], payload[..6]);
        assert!(out.ends_with(&[0, 0, 0]));
        assert_eq!(authority_of(&out[15..out.len() - 3]), b"_run_x.sock");
    }

    #[tokio::test]
    async fn the_stream_is_rewritten_in_pieces_and_other_frames_pass_through() {
        let path = b"/tmp/k/plugins/x/csi.sock";
        let settings = frame(0x4, 0, &[0, 3, 0, 0, 0, 100]);
        let headers = frame(TYPE_HEADERS, FLAG_END_HEADERS, &grpc_go_block(path));
        let data = frame(0x0, 0x1, &[0, 0, 0, 0, 2, 0xaa, 0xbb]);
        let cont = frame(TYPE_HEADERS, 0, &grpc_go_block(path)); // END_HEADERS unset
        let mut input = PREFACE.to_vec();
        for f in [&settings, &headers, &data, &cont] {
            input.extend_from_slice(f);
        }
        // Delivered one byte at a time.
        let (mut w, r) = tokio::io::duplex(1);
        let feed = input.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            w.write_all(&feed).await.unwrap();
        });
        let mut rw = Rewriting::new(r);
        let mut got = Vec::new();
        rw.read_to_end(&mut got).await.unwrap();
        assert_eq!(rw.rewritten, 1);
        let mut want = PREFACE.to_vec();
        want.extend_from_slice(&settings);
        let fixed = rewrite_headers_frame(&headers).unwrap();
        want.extend_from_slice(&fixed);
        want.extend_from_slice(&data);
        want.extend_from_slice(&cont);
        assert_eq!(got, want);
        assert_eq!(authority_of(&fixed[9..]), b"_tmp_k_plugins_x_csi.sock");
        // Not HTTP/2: passed through untouched.
        let (mut w, r) = tokio::io::duplex(64);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            w.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        });
        let mut rw = Rewriting::new(r);
        let mut got = Vec::new();
        rw.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"GET / HTTP/1.1\r\n\r\n");
    }
}
