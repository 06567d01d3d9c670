//! The RLS service: the rules in force (replaced by a reload), loaded and checked for what
//! this build serves, and Envoy's `RateLimitService` over gRPC.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::decide::decide;
use crate::rls_rules::RlsState;
use crate::state::AppState;

/// The largest request message the gRPC service reads (Envoy's are a few hundred bytes).
pub(crate) const MAX_MESSAGE: usize = 1024 * 1024;

/// Envoy's `RateLimitService` over the service's store.
pub(crate) struct Service {
    pub(crate) state: Arc<AppState>,
    pub(crate) rls: Arc<RlsState>,
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let rules = self.rls.config();
        let answer = decide(
            &self.state,
            &rules,
            request.get_ref(),
            self.rls.response_headers,
        )
        .await?;
        Ok(tonic::Response::new(answer.response))
    }
}

/// The gRPC service, ready to serve.
pub(crate) fn server(service: Service) -> RateLimitServiceServer<Service> {
    RateLimitServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE)
}
