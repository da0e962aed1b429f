//! The scheduler service: durable reminders that fire as events into
//! sessions (`agentry.scheduler.v1.Scheduler`).
//!
//! This version serves the contract's health and reflection endpoints and
//! answers every reminder call with UNIMPLEMENTED and a clear message, so
//! that clients learn the feature is missing rather than hanging or
//! receiving made-up data.

use agentry_proto::scheduler::v1 as pb;
use agentry_proto::scheduler::v1::scheduler_server::{Scheduler, SchedulerServer};
use std::future::Future;
use std::pin::Pin;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::{Request, Response, Status, Streaming};

const NOT_YET: &str = "reminders are not available in this version of Agentry";

/// The Scheduler gRPC service.
#[derive(Debug, Clone, Default)]
pub struct SchedulerService;

type DueStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::DueReminder, Status>> + Send>>;

#[tonic::async_trait]
impl Scheduler for SchedulerService {
    async fn create_reminder(
        &self,
        _request: Request<pb::CreateReminderRequest>,
    ) -> Result<Response<pb::Reminder>, Status> {
        Err(Status::unimplemented(NOT_YET))
    }

    async fn list_reminders(
        &self,
        _request: Request<pb::ListRemindersRequest>,
    ) -> Result<Response<pb::ListRemindersResponse>, Status> {
        Err(Status::unimplemented(NOT_YET))
    }

    async fn cancel_reminder(
        &self,
        _request: Request<pb::CancelReminderRequest>,
    ) -> Result<Response<pb::Reminder>, Status> {
        Err(Status::unimplemented(NOT_YET))
    }

    type StreamDueStream = DueStream;

    async fn stream_due(
        &self,
        _request: Request<Streaming<pb::StreamDueRequest>>,
    ) -> Result<Response<Self::StreamDueStream>, Status> {
        Err(Status::unimplemented(NOT_YET))
    }
}

/// Serves the scheduler on `listener` until `shutdown`.
pub async fn run(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentry_runtime::ServeError> {
    agentry_runtime::serve(
        listener,
        Routes::new(SchedulerServer::new(SchedulerService)),
        &[SchedulerServer::<SchedulerService>::NAME],
        shutdown,
    )
    .await
}
