//! Which replica drives a session, and getting an input or a follower to
//! it: the registry of this replica's session actors (loading a session
//! from its log on first use), and forwarding to the replica that holds a
//! session's lease.

use super::*;

impl Sessions {
    /// The actor of a session, loading the session from its log if needed;
    /// with several replicas, the replica that drives the session when it
    /// is not this one.
    ///
    /// Loading (reading and replaying the log) holds only that session's
    /// slot: inputs to other sessions go on meanwhile, and inputs to this
    /// one wait for it and then share the actor it started.
    pub(super) async fn route(&self, session_id: &str) -> Result<Route, Status> {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session_id.to_string())
            .or_default()
            .clone();
        let mut current = slot.lock().await;
        if let Some(handle) = current.as_ref()
            && !handle.commands.is_closed()
        {
            return Ok(Route::Here(handle.clone()));
        }
        let acquired = match &self.deps.cluster {
            None => Ok(0),
            // A replica just started may not have landed its first
            // heartbeat yet: an input waits a beat for it.
            Some(cluster) if !cluster.alive_within(crate::cluster::HEARTBEAT_EVERY).await => {
                Err(Err(Status::unavailable(
                    "this orchestrator replica cannot renew its heartbeat in the session store, \
                     so it drives no session now; try again, or another replica",
                )))
            }
            Some(cluster) => match cluster.acquire(&self.deps.store, session_id).await {
                Ok(Driver::Here(epoch)) => Ok(epoch),
                Ok(Driver::Elsewhere(url)) => Err(Ok(Route::Elsewhere(url))),
                Err(status) => Err(Err(store_status(&self.deps.store_url, status))),
            },
        };
        let loaded = match acquired {
            Ok(epoch) => self.load(session_id, epoch).await,
            Err(other) => {
                drop(current);
                self.forget(session_id, &slot);
                return other;
            }
        };
        match loaded {
            Ok(handle) => {
                *current = Some(handle.clone());
                Ok(Route::Here(handle))
            }
            Err(status) => {
                drop(current);
                self.forget(session_id, &slot);
                Err(status)
            }
        }
    }

    /// Forgets the slot of a session that is not loaded here (it may not
    /// exist, or another replica drives it), unless another caller has
    /// replaced it.
    pub(super) fn forget(&self, session_id: &str, slot: &SessionSlot) {
        // The map's reference and the caller's only: nobody else is about
        // to load into this slot.
        self.remove_dead_slot(session_id, Some(slot), 2);
    }

    /// Forgets the slot of a session whose actor ended after idling,
    /// unless someone holds the slot (they are routing to it, see the
    /// actor gone and load the session again) or it holds a newer actor.
    pub(crate) fn unloaded(&self, session_id: &str) {
        // Only the map's reference: routes clone the slot under this lock,
        // so nobody is about to load into it.
        self.remove_dead_slot(session_id, None, 1);
    }

    /// Removes a session's slot (only `slot`, when given) when `held` are
    /// all the references to it and the actor it holds, if any, has ended.
    fn remove_dead_slot(&self, session_id: &str, slot: Option<&SessionSlot>, held: usize) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.get(session_id).is_some_and(|s| {
            slot.is_none_or(|slot| Arc::ptr_eq(s, slot))
                && Arc::strong_count(s) == held
                && s.try_lock()
                    .is_ok_and(|h| h.as_ref().is_none_or(|h| h.commands.is_closed()))
        }) {
            sessions.remove(session_id);
        }
    }

    /// Stops a session's actor here, if it runs (the session is being
    /// deleted).
    pub(super) async fn unload(&self, session_id: &str) {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id);
        if let Some(slot) = slot {
            slot.lock().await.take();
        }
    }

    /// Stops every session actor of this replica (its lease lapsed: other
    /// replicas may drive its sessions now); inputs load them again,
    /// through a new lease or to the replica that drives them.
    pub fn drop_sessions(&self) {
        let slots: Vec<SessionSlot> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            if let Ok(mut handle) = slot.try_lock() {
                handle.take();
            }
        }
    }

    /// A session's whole log.
    pub(super) async fn read_log(&self, session_id: &str) -> Result<Vec<spb::Event>, Status> {
        self.deps.read_log(session_id).await
    }

    /// The most recently updated sessions, `limit` of them (open turns only
    /// when asked).
    pub(super) async fn recent_sessions(
        &self,
        limit: u32,
        only_open_turns: bool,
    ) -> Result<Vec<spb::Session>, Status> {
        Ok(self
            .deps
            .store
            .clone()
            .list_sessions(spb::ListSessionsRequest {
                limit,
                offset: 0,
                only_open_turns,
            })
            .await
            .map_err(|s| store_status(&self.deps.store_url, s))?
            .into_inner()
            .sessions)
    }

    /// Reads a session's log (from its checkpoint, when it has a usable
    /// one), replays it and starts its actor, which appends with lease
    /// `lease_epoch` (0: no lease).
    pub(super) async fn load(
        &self,
        session_id: &str,
        lease_epoch: u64,
    ) -> Result<SessionHandle, Status> {
        let (checkpoint, after) = self.deps.read_after_checkpoint(session_id).await?;
        // A sub-agent's session runs as its agent, in its parent's
        // workspace (the id names it: only the delegate tool makes those).
        let child = if session_id.starts_with(crate::agents::TASK_PREFIX) {
            let session = self.get(session_id.to_string()).await?;
            match session.parent {
                Some(parent) => {
                    let agent = self.settings.agents.get(&parent.agent).ok_or_else(|| {
                        Status::failed_precondition(format!(
                            "session {session_id} is a task of the agent {:?}, which is no \
                             longer configured",
                            parent.agent
                        ))
                    })?;
                    let workspace = self.workspace_of(&parent.session_id).await?;
                    Some(crate::actor::Child {
                        agent,
                        workspace,
                        orphan: false,
                    })
                }
                None => None,
            }
        } else if session_id.starts_with(crate::agents::AGENT_RUN_PREFIX) {
            // A scheduled run works as its agent, in its own workspace.
            let session = self.get(session_id.to_string()).await?;
            match session.parent.filter(|p| !p.agent.is_empty()) {
                Some(parent) => {
                    let agent = self.settings.agents.get(&parent.agent).ok_or_else(|| {
                        Status::failed_precondition(format!(
                            "session {session_id} works as the agent {:?}, which is no longer \
                             configured",
                            parent.agent
                        ))
                    })?;
                    Some(crate::actor::Child {
                        agent,
                        workspace: session_id.to_string(),
                        orphan: false,
                    })
                }
                None => None,
            }
        } else {
            None
        };
        let fresh = match &child {
            Some(child) => self.settings.fresh_as(&child.agent),
            None => self.settings.fresh(),
        };
        let resumed = checkpoint.as_ref().and_then(|checkpoint| {
            Some((fresh.clone().resumed(checkpoint, &after)?, checkpoint.seq))
        });
        let metrics = &self.deps.metrics;
        let (state, log_len, checkpointed_at) = match (resumed, checkpoint) {
            (Some((state, at)), _) => {
                crate::metrics::session_loaded(metrics, "checkpoint", after.len() as u64);
                let log_len = after.last().map_or(at, |e| e.seq);
                (state, log_len, at)
            }
            (None, None) => {
                crate::metrics::session_loaded(metrics, "log", after.len() as u64);
                (fresh.replayed(&after), after.len() as u64, 0)
            }
            // A checkpoint that cannot stand for the log's start (a later
            // rewind went back past it; other settings): the whole log.
            (None, Some(_)) => {
                let events = self.read_log(session_id).await?;
                crate::metrics::session_loaded(metrics, "log", events.len() as u64);
                (fresh.replayed(&events), events.len() as u64, 0)
            }
        };
        // A task whose delegate call has ended (answered, refused, skipped
        // after a restart) does not go on by itself: it is cancelled instead
        // of recovered.
        let mut child = child;
        if let Some(child) = &mut child
            && !state.is_idle()
        {
            child.orphan = self.task_call_ended(session_id).await?;
        }
        let handle = Actor::spawn(
            session_id.to_string(),
            state,
            crate::actor::LogPosition {
                log_len,
                checkpointed_at,
            },
            lease_epoch,
            self.clone(),
            child,
        );
        Ok(handle)
    }

    /// Whether the delegate call a sub-agent's session works for has a
    /// result in its parent's log.
    pub(super) async fn task_call_ended(&self, session_id: &str) -> Result<bool, Status> {
        let session = self.get(session_id.to_string()).await?;
        let Some(parent) = session.parent else {
            return Ok(false);
        };
        let log = self.read_log(&parent.session_id).await?;
        Ok(crate::agents::call_ended(
            &log,
            &parent.session_id,
            &parent.call_id,
            session_id,
        ))
    }

    /// The session whose workspace `session_id` works in: its own, or its
    /// parent's for a sub-agent's session.
    pub(super) async fn workspace_of(&self, session_id: &str) -> Result<String, Status> {
        let session = self.get(session_id.to_string()).await?;
        // A scheduled run as an agent names only the agent: its own.
        Ok(match session.parent {
            Some(parent) if !parent.session_id.is_empty() => parent.session_id,
            _ => session.id,
        })
    }

    /// The clients of the other services.
    pub fn deps(&self) -> &Arc<Deps> {
        &self.deps
    }

    /// How sessions are run.
    pub fn settings(&self) -> &Arc<crate::settings::Settings> {
        &self.settings
    }

    /// Loads every session whose last turn never finished, so that each is
    /// recovered (see [`SessionState::step`] with `Interrupted`) without
    /// waiting for a client. Retries while the store is unreachable.
    pub async fn recover_open_sessions(&self) {
        let mut delay = std::time::Duration::from_millis(200);
        let sessions = loop {
            match self.deps.all_sessions(true).await {
                Ok(sessions) => break sessions,
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                Err(status) => {
                    tracing::error!(error = %status.message(), "cannot list sessions to recover");
                    return;
                }
            }
        };
        for session in sessions {
            if self.is_loaded(&session.id) {
                continue;
            }
            // A sub-agent's task is taken up by its delegate call (run
            // again, or ended: then the task is cancelled), not on its own;
            // unless that call has already ended (the task's start failed
            // after its first events were stored): nothing else would close
            // the task's turn, so it is loaded here, and cancelled.
            if session
                .parent
                .as_ref()
                .is_some_and(|p| !p.session_id.is_empty())
                && !matches!(self.task_call_ended(&session.id).await, Ok(true))
            {
                continue;
            }
            match self.route(&session.id).await {
                Ok(Route::Here(_)) => {
                    tracing::info!(session_id = %session.id, "recovering a session with an unfinished turn");
                    if self.deps.cluster.is_some() {
                        crate::metrics::session_routed(&self.deps.metrics, "taken_over");
                    }
                }
                Ok(Route::Elsewhere(_)) => {}
                Err(status) => {
                    tracing::error!(session_id = %session.id, error = %status.message(), "cannot recover session");
                }
            }
        }
    }

    /// Whether this replica has the session's actor running.
    pub(super) fn is_loaded(&self, session_id: &str) -> bool {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_id)
            .cloned();
        slot.is_some_and(|slot| {
            slot.try_lock()
                .is_ok_and(|h| h.as_ref().is_some_and(|h| !h.commands.is_closed()))
        })
    }

    /// Submits one input made here (a reminder, a resource update) to a
    /// session.
    pub async fn submit_input(&self, session_id: &str, input: Input) -> Result<Submitted, Status> {
        self.submit_routed(session_id, input, None, false, None)
            .await
    }

    /// Submits one input to a session here, or to the replica that drives
    /// it (unless the input was forwarded here already). `received` is the
    /// input as a client sent it: it is passed on as received, and the
    /// replica that drives the session reads the files and resources its
    /// message attaches. `by` is who sent it (`None`: made here).
    pub(super) async fn submit_routed(
        &self,
        session_id: &str,
        input: Input,
        received: Option<&pb::Input>,
        forwarded: bool,
        by: Option<&agentry_runtime::auth::Principal>,
    ) -> Result<Submitted, Status> {
        let mut raw = Some(input);
        let mut attached: Option<Input> = None;
        // One retry covers an actor that stopped (store trouble) just now.
        for _ in 0..2 {
            let handle = match self.route(session_id).await? {
                Route::Here(handle) => handle,
                Route::Elsewhere(url) => {
                    let passed = match received {
                        Some(received) => Some(received.clone()),
                        None => attached
                            .as_ref()
                            .or(raw.as_ref())
                            .and_then(crate::cluster::forwardable),
                    };
                    return self.forward(session_id, &url, passed, forwarded, by).await;
                }
            };
            let input = match (attached.clone(), raw.take()) {
                (Some(input), _) => input,
                (None, Some(input)) if received.is_some() => {
                    self.with_attachments(session_id, input).await?
                }
                (None, Some(input)) => input,
                (None, None) => break,
            };
            attached = Some(input.clone());
            let (reply, answer) = oneshot::channel();
            let command = Box::new(Command::Input {
                input,
                by: by.map(|p| p.name.clone()),
                reply,
            });
            if handle.commands.send(command).await.is_err() {
                continue;
            }
            match answer.await {
                // Another replica took the session over: the actor
                // stopped; route the input again.
                Ok(Err(status)) if lease_lost(&status) => continue,
                Ok(result) => return result,
                Err(_) => continue,
            }
        }
        Err(Status::unavailable(format!(
            "session {session_id} could not take the input; the session store at {} may be down",
            self.deps.store_url
        )))
    }

    /// Sends an input to the replica at `url`, which drives the session,
    /// for `by`.
    pub(super) async fn forward(
        &self,
        session_id: &str,
        url: &str,
        input: Option<pb::Input>,
        forwarded: bool,
        by: Option<&agentry_runtime::auth::Principal>,
    ) -> Result<Submitted, Status> {
        let Some(input) = input else {
            return Err(driven_elsewhere(session_id, url));
        };
        let response = self
            .driver(session_id, url, forwarded)?
            .submit(crate::cluster::forwarded(
                pb::SubmitRequest {
                    session_id: session_id.to_string(),
                    input: Some(input),
                },
                by,
            ))
            .await
            .map_err(|s| driver_status(session_id, url, s))?
            .into_inner();
        Ok(Submitted {
            turn_id: response.turn_id,
            seq: response.seq,
        })
    }

    /// A client of the replica at `url`, which drives `session_id`, to pass
    /// it a request (never one that was forwarded here already).
    pub(super) fn driver(
        &self,
        session_id: &str,
        url: &str,
        forwarded: bool,
    ) -> Result<
        agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
            agentry_runtime::telemetry::TracedChannel,
        >,
        Status,
    > {
        match (&self.deps.cluster, forwarded) {
            (Some(cluster), false) => {
                crate::metrics::session_routed(&self.deps.metrics, "forwarded");
                cluster.peer(url)
            }
            _ => Err(driven_elsewhere(session_id, url)),
        }
    }

    /// A session's events from `from_seq` on, the logged ones with the
    /// live ones (streamed text) in place.
    pub(super) async fn follow(
        &self,
        session_id: String,
        from_seq: u64,
    ) -> Result<ReceiverStream<Result<spb::Event, Status>>, Status> {
        // Live events are followed first: none is missed between the log's
        // replay and them.
        let local = self.deps.live.follow(&session_id);
        let logged = self.watch(session_id.clone(), from_seq).await?;
        let (remote, nudge) = match &self.deps.cluster {
            Some(cluster) => {
                let (tx, rx) = mpsc::channel(256);
                let nudge = Arc::new(tokio::sync::Notify::new());
                tokio::spawn(crate::live::follow_driver(
                    cluster.clone(),
                    self.deps.store.clone(),
                    session_id,
                    tx,
                    nudge.clone(),
                ));
                (Some(rx), Some(nudge))
            }
            None => (None, None),
        };
        Ok(ReceiverStream::new(crate::live::merge(
            logged, local, remote, from_seq, nudge,
        )))
    }

    pub(super) async fn watch(
        &self,
        session_id: String,
        from_seq: u64,
    ) -> Result<Streaming<spb::Event>, Status> {
        self.deps
            .store
            .clone()
            .watch(spb::WatchRequest {
                session_id,
                from_seq,
            })
            .await
            .map(Response::into_inner)
            .map_err(|s| store_status(&self.deps.store_url, s))
    }
}

/// Why an input does not go to `url`, the replica driving `session_id`.
pub(super) fn driven_elsewhere(session_id: &str, url: &str) -> Status {
    agentry_runtime::reasons::with_metadata(
        tonic::Code::FailedPrecondition,
        agentry_runtime::reasons::Reason::DrivenElsewhere,
        format!("session {session_id} is driven by the orchestrator at {url}"),
        std::collections::HashMap::from([("url".to_string(), url.to_string())]),
    )
}

/// A failure of the replica driving `session_id`, as the client sees it.
pub(super) fn driver_status(session_id: &str, url: &str, status: Status) -> Status {
    match status.code() {
        tonic::Code::Unavailable => Status::unavailable(format!(
            "the orchestrator driving session {session_id} at {url} does not answer ({}); \
             another replica takes the session over within seconds: try again",
            status.message()
        )),
        _ => status,
    }
}

/// Whether an append was refused because another replica drives the
/// session now.
pub(super) fn lease_lost(status: &Status) -> bool {
    agentry_runtime::reasons::reason_of(status) == agentry_runtime::reasons::Reason::LeaseLost
}
