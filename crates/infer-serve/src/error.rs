//! The one error type clients see, and its mapping to HTTP statuses and gRPC status codes.
//!
//! Every failure a client can see is an [`ApiError`]; [`ApiError::status`] is the only place
//! that decides its HTTP status, [`ApiError::grpc_code`] the only place that decides its gRPC
//! status code, and [`ApiError::retry_after`] the only place that decides whether a
//! `Retry-After` header goes with it. The HTTP body is always V2's `{"error": "..."}`; over
//! gRPC the same message goes in `grpc-message`.

use hyper::StatusCode;

/// Why a request was refused with 503; also the `reason` label of the rejection counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The queue already holds `max_queue_size` requests.
    QueueFull,
    /// The request's deadline passed in the queue or during execution.
    Timeout,
    /// The client went away while the request waited.
    Cancelled,
    /// The server is stopping.
    ShuttingDown,
}

impl Rejection {
    pub const ALL: [Rejection; 4] = [
        Rejection::QueueFull,
        Rejection::Timeout,
        Rejection::Cancelled,
        Rejection::ShuttingDown,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::Timeout => "timeout",
            Rejection::Cancelled => "cancelled",
            Rejection::ShuttingDown => "shutting_down",
        }
    }
}

/// The gRPC status codes infer-serve answers with (`grpc-status`; the numbers are the
/// protocol's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

/// Everything that can go wrong with a request, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("request body is larger than the limit of {limit} bytes (server.max_body_bytes)")]
    PayloadTooLarge { limit: u64 },
    /// A request that can never be served as sent: more texts, bytes or memory than a bound
    /// allows (the message names the bound and its key). 413, gRPC `RESOURCE_EXHAUSTED`.
    #[error("{0}")]
    TooLarge(String),
    /// The server cannot take the request now (the memory the requests in flight hold is at
    /// its budget): 503 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED`.
    #[error("{0}")]
    Overloaded(String),
    /// An HTTP/2 request to the gRPC port that is not gRPC (its content type).
    #[error("not a gRPC request: content-type {0:?} (application/grpc expected)")]
    NotGrpc(String),
    /// A gRPC method or encoding the server does not implement.
    #[error("{0}")]
    Unimplemented(String),
    /// The request body came slower than `[server]` allows (`body_read_timeout_s`,
    /// `body_min_bytes_per_s`).
    #[error("the request body came too slowly: {received} bytes in {seconds} s (server.body_read_timeout_s, server.body_min_bytes_per_s)")]
    BodyTimeout { received: u64, seconds: u64 },
    #[error("model is not ready")]
    NotReady,
    #[error("{}", rejection_message(*.0))]
    Rejected(Rejection),
    #[error("inference failed: {0}")]
    Internal(String),
    /// The device is unusable for the rest of the process (a sticky CUDA error): this server
    /// answers no more inferences and is not ready; another replica, or this one restarted, can.
    #[error(
        "the device is unusable until infer-serve restarts (this server is no longer ready): {0}"
    )]
    DeviceLost(String),
}

fn rejection_message(r: Rejection) -> &'static str {
    match r {
        Rejection::QueueFull => "queue is full (max_queue_size reached)",
        Rejection::Timeout => "request timeout expired",
        Rejection::Cancelled => "request cancelled",
        Rejection::ShuttingDown => "server is shutting down",
    }
}

impl ApiError {
    /// The HTTP status: the one mapping from errors to statuses.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } | ApiError::TooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::NotGrpc(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unimplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::NotReady
            | ApiError::Rejected(_)
            | ApiError::DeviceLost(_)
            | ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code: the one mapping from errors to gRPC statuses. Retryable
    /// refusals are `UNAVAILABLE`, as 503 is over HTTP, except a passed deadline.
    pub fn grpc_code(&self) -> GrpcCode {
        match self {
            ApiError::BadRequest(_) => GrpcCode::InvalidArgument,
            ApiError::NotFound(_) => GrpcCode::NotFound,
            ApiError::MethodNotAllowed { .. } | ApiError::Unimplemented(_) => {
                GrpcCode::Unimplemented
            }
            ApiError::PayloadTooLarge { .. } | ApiError::TooLarge(_) | ApiError::Overloaded(_) => {
                GrpcCode::ResourceExhausted
            }
            ApiError::NotGrpc(_) => GrpcCode::InvalidArgument,
            ApiError::Rejected(Rejection::Timeout) | ApiError::BodyTimeout { .. } => {
                GrpcCode::DeadlineExceeded
            }
            ApiError::Rejected(Rejection::Cancelled) => GrpcCode::Cancelled,
            ApiError::NotReady | ApiError::Rejected(_) | ApiError::DeviceLost(_) => {
                GrpcCode::Unavailable
            }
            ApiError::Internal(_) => GrpcCode::Internal,
        }
    }

    /// Seconds for `Retry-After`, where retrying (here or on another replica) makes sense.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            ApiError::NotReady
            | ApiError::Rejected(_)
            | ApiError::DeviceLost(_)
            | ApiError::Overloaded(_) => Some(1),
            _ => None,
        }
    }

    /// The V2 error body.
    pub fn body(&self) -> String {
        serde_json::json!({ "error": self.to_string() }).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(e: ApiError, status: u16, retry: Option<u32>, body: &str) {
        assert_eq!(e.status().as_u16(), status, "{e:?}");
        let grpc = match status {
            400 => GrpcCode::InvalidArgument,
            404 => GrpcCode::NotFound,
            413 => GrpcCode::ResourceExhausted,
            500 => GrpcCode::Internal,
            501 => GrpcCode::Unimplemented,
            408 => GrpcCode::DeadlineExceeded,
            _ if e == ApiError::Rejected(Rejection::Timeout) => GrpcCode::DeadlineExceeded,
            _ => GrpcCode::Unavailable,
        };
        assert_eq!(e.grpc_code(), grpc, "{e:?}");
        assert_eq!(e.retry_after(), retry, "{e:?}");
        assert_eq!(e.body(), body);
    }

    #[test]
    fn mapping() {
        check(
            ApiError::BadRequest("bad".into()),
            400,
            None,
            r#"{"error":"bad"}"#,
        );
        check(
            ApiError::NotFound("unknown model \"x\"".into()),
            404,
            None,
            r#"{"error":"unknown model \"x\""}"#,
        );
        check(
            ApiError::PayloadTooLarge { limit: 10 },
            413,
            None,
            r#"{"error":"request body is larger than the limit of 10 bytes (server.max_body_bytes)"}"#,
        );
        check(
            ApiError::BodyTimeout {
                received: 5,
                seconds: 31,
            },
            408,
            None,
            r#"{"error":"the request body came too slowly: 5 bytes in 31 s (server.body_read_timeout_s, server.body_min_bytes_per_s)"}"#,
        );
        check(
            ApiError::NotReady,
            503,
            Some(1),
            r#"{"error":"model is not ready"}"#,
        );
        check(
            ApiError::Rejected(Rejection::QueueFull),
            503,
            Some(1),
            r#"{"error":"queue is full (max_queue_size reached)"}"#,
        );
        check(
            ApiError::Rejected(Rejection::Timeout),
            503,
            Some(1),
            r#"{"error":"request timeout expired"}"#,
        );
        check(
            ApiError::Unimplemented("method /a/b is not implemented".into()),
            501,
            None,
            r#"{"error":"method /a/b is not implemented"}"#,
        );
        check(
            ApiError::DeviceLost("CUDA error 700".into()),
            503,
            Some(1),
            r#"{"error":"the device is unusable until infer-serve restarts (this server is no longer ready): CUDA error 700"}"#,
        );
        check(
            ApiError::TooLarge("100000 texts, more than text.max_client_batch_size 1024".into()),
            413,
            None,
            r#"{"error":"100000 texts, more than text.max_client_batch_size 1024"}"#,
        );
        let busy = ApiError::Overloaded("the memory budget is held".into());
        assert_eq!(busy.status().as_u16(), 503);
        assert_eq!(busy.retry_after(), Some(1));
        assert_eq!(busy.grpc_code(), GrpcCode::ResourceExhausted);
        let e = ApiError::NotGrpc("text/plain".into());
        assert_eq!(e.status().as_u16(), 415);
        check(
            ApiError::Internal("boom".into()),
            500,
            None,
            r#"{"error":"inference failed: boom"}"#,
        );
    }
}
