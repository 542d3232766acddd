//! A minimal HTTP/1.1 client for the plain-HTTP endpoints (`/health`,
//! `/livez`, `/readyz`, `/version`, `/metrics`): one request per
//! connection (`Connection: close`), the whole answer read, chunked
//! bodies decoded. Enough to compare status lines, headers and bodies
//! byte for byte; no TLS (probes in these tests use `http://` URLs).

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// One answer.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding removed).
    pub body: String,
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Result<HttpResponse> {
    request("GET", url, &[]).await
}

/// `method url` with extra request headers.
pub async fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(method, url, headers))
        .await
        .map_err(|_| anyhow!("{method} {url}: no answer in {REQUEST_TIMEOUT:?}"))?
        .with_context(|| format!("{method} {url}"))
}

async fn exchange(method: &str, url: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("only http:// URLs"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = TcpStream::connect(host).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw)
}

fn parse(raw: &[u8]) -> Result<HttpResponse> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = std::str::from_utf8(&raw[..split])?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body: String::from_utf8(body)?,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunk size"))?;
        let size_text = std::str::from_utf8(&data[..eol])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let r = parse(raw).expect("parse");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "abcde");
        assert_eq!(r.header("x-a"), Some("b"));
    }
}
