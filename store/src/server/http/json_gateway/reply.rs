//! HTTP answers as etcd 3.5's grpc-gateway (v1) writes them.
//!
//! - A unary answer is the message's JSON, `200`, with the gRPC response
//!   header the gateway forwards (`Grpc-Metadata-Content-Type`).
//! - A failed call is `{"error":msg,"code":grpc_code,"message":msg}` with
//!   the HTTP status the gateway maps the gRPC code to ([`http_status`]).
//! - A stream that fails writes one `{"error":{"grpc_code",...}}` chunk
//!   (its status line is the mapped one if nothing was written before).
//! - Paths the gateway does not know and methods it does not serve are Go's
//!   plain-text `http.Error` answers (`Not Found`, `Method Not Allowed`).
//!
//! (etcd's CORS headers and preflight answers come from the client port's
//! own layer, `server::http::cors`, around these routes as around all.)

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde::Serialize;
use tonic::{Code, Status};

use super::json;

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
/// The gRPC response header the gateway passes on as HTTP metadata.
const GRPC_CONTENT_TYPE: (&str, &str) = ("grpc-metadata-content-type", "application/grpc");
/// The HTTP status grpc-gateway v1 (`runtime.HTTPStatusFromCode`) gives a
/// gRPC code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A unary call's answer.
pub fn message<T: Serialize>(msg: &T) -> Response {
    let mut resp = with_type(StatusCode::OK, JSON, Body::from(json::encode(msg)));
    add_grpc_metadata(&mut resp);
    resp
}

/// A streaming answer that has started well: `200` and the chunks.
pub fn stream(body: Body) -> Response {
    let mut resp = with_type(StatusCode::OK, JSON, body);
    add_grpc_metadata(&mut resp);
    resp
}

/// A streaming answer whose stream failed before its first message.
pub fn stream_failed(status: &Status) -> Response {
    with_type(
        http_status(status.code()),
        JSON,
        Body::from(stream_error_chunk(status)),
    )
}

/// The body of a failed call.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: i32,
    message: &'a str,
}

/// A failed call's answer.
pub fn error(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        code: status.code() as i32,
        message: status.message(),
    };
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    with_type(http_status(status.code()), JSON, Body::from(bytes))
}

/// The gateway's `StreamError`, as the last chunk of a failed stream.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

#[derive(Serialize)]
struct StreamErrorChunk<'a> {
    error: StreamError<'a>,
}

/// The chunk a stream ends with when its call fails.
pub fn stream_error_chunk(status: &Status) -> Vec<u8> {
    let http = http_status(status.code());
    let chunk = StreamErrorChunk {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: http.as_u16(),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or_default(),
        },
    };
    serde_json::to_vec(&chunk).unwrap_or_default()
}

/// A path under `/v3/` that names no gateway method.
pub fn not_found() -> Response {
    go_http_error(StatusCode::NOT_FOUND)
}

/// A gateway path asked with a method other than `POST`.
pub fn method_not_allowed() -> Response {
    go_http_error(StatusCode::METHOD_NOT_ALLOWED)
}

/// Go's `http.Error`: the status text and a newline, as plain text.
fn go_http_error(status: StatusCode) -> Response {
    let text = format!("{}\n", status.canonical_reason().unwrap_or_default());
    let mut resp = with_type(status, TEXT, Body::from(text));
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

fn with_type(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn add_grpc_metadata(resp: &mut Response) {
    let (name, value) = GRPC_CONTENT_TYPE;
    resp.headers_mut()
        .insert(name, HeaderValue::from_static(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(resp: Response) -> String {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn error_bodies() {
        let resp = error(&Status::not_found("etcdserver: requested lease not found"));
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            body_of(resp).await,
            r#"{"error":"etcdserver: requested lease not found","code":5,"message":"etcdserver: requested lease not found"}"#
        );
        let chunk = stream_error_chunk(&Status::unknown("auth: user name is empty"));
        assert_eq!(
            String::from_utf8(chunk).unwrap(),
            r#"{"error":{"grpc_code":2,"http_code":500,"message":"auth: user name is empty","http_status":"Internal Server Error"}}"#
        );
        assert_eq!(body_of(method_not_allowed()).await, "Method Not Allowed\n");
    }

    #[test]
    fn statuses_as_the_gateway_maps_them() {
        assert_eq!(http_status(Code::OutOfRange), StatusCode::BAD_REQUEST);
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
