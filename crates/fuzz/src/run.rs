//! The campaign: saved inputs first, then rounds of generated inputs for
//! every selected RPC (a few of each in turn, so that what one RPC stores
//! is what the next one reads), the stored-data and canary checks after
//! each round; then the config loader.

use crate::cluster::Fuzzed;
use crate::config_fuzz::{self, ConfigCase, Keys};
use crate::corpus;
use crate::dict::Pools;
use crate::generate::{self, Source};
use crate::oracle::{self, Evidence, Finding};
use crate::rng::Rng;
use crate::safety;
use crate::schema::{Method, Schema};
use crate::stored::Readback;
use crate::target::{Credential, Outcome};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Inputs of one RPC per round.
const ROUND: u64 = 50;
/// The name of the config loader in `--only` and the report.
pub const CONFIG: &str = "config/load";
/// How long a config load may take.
const CONFIG_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a long run says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);
/// Tries to generate an input the safety check lets through.
const SAFE_TRIES: usize = 8;

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub inputs: u64,
    pub only: Vec<String>,
    /// Where new findings are saved (and replayed from).
    pub corpus: PathBuf,
    /// Saved inputs replayed besides `corpus` (the repository's).
    pub builtin_corpus: PathBuf,
    /// Calls that start a process, at most this many a second.
    pub spawn_rate: f64,
}

/// One call's input.
struct Call {
    messages: Vec<Vec<u8>>,
    credential: Credential,
    /// The person a call says it is made for (`x-agentry-person`).
    person: Option<&'static str>,
    /// Keep the request stream open until the answer idles.
    keep_open: bool,
}

/// Figures of one RPC (or the config loader).
#[derive(Debug, Default)]
pub struct Stats {
    pub inputs: u64,
    pub busy: Duration,
    pub codes: BTreeSet<String>,
    pub findings: u64,
    /// Inputs that were mutated bytes.
    pub mutated: u64,
    /// Generated inputs the safety check held back (regenerated).
    pub held: u64,
    /// Calls that waited for the process rate limit.
    pub limited: u64,
}

/// At most `rate` calls a second (a token bucket of one second's worth).
struct Limiter {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Limiter {
    async fn acquire(&mut self) -> bool {
        let refill = |l: &mut Limiter| {
            let now = Instant::now();
            l.tokens = (l.tokens + now.duration_since(l.last).as_secs_f64() * l.rate).min(l.rate);
            l.last = now;
        };
        refill(self);
        let waited = self.tokens < 1.0;
        if waited {
            tokio::time::sleep(Duration::from_secs_f64((1.0 - self.tokens) / self.rate)).await;
            refill(self);
        }
        self.tokens -= 1.0;
        waited
    }
}

/// The whole run's state.
pub struct Runner {
    opts: Options,
    schema: Schema,
    pools: Pools,
    pub stats: BTreeMap<String, Stats>,
    pub findings: Vec<(Finding, u64)>,
    seen: HashMap<String, usize>,
    limiter: Limiter,
}

impl Runner {
    pub fn new(opts: Options) -> anyhow::Result<Runner> {
        let schema = Schema::decode(agentry_proto::FILE_DESCRIPTOR_SET)?;
        let rate = opts.spawn_rate.max(0.1);
        Ok(Runner {
            opts,
            schema,
            pools: Pools::default(),
            stats: BTreeMap::new(),
            findings: Vec::new(),
            seen: HashMap::new(),
            limiter: Limiter {
                rate,
                tokens: rate,
                last: Instant::now(),
            },
        })
    }

    /// The RPCs `--only` selects.
    pub fn methods(&self) -> Vec<Method> {
        self.schema.selected(&self.opts.only).cloned().collect()
    }

    /// Whether `--only` selects the config loader.
    pub fn config_selected(&self) -> bool {
        self.opts.only.is_empty()
            || self
                .opts
                .only
                .iter()
                .any(|o| o.eq_ignore_ascii_case(CONFIG) || o.eq_ignore_ascii_case("config"))
    }

    fn saved(&self) -> (Vec<corpus::Saved>, Vec<(PathBuf, ConfigCase)>) {
        let mut skipped = Vec::new();
        let (mut rpcs, mut configs) = corpus::load(&self.opts.builtin_corpus, &mut skipped);
        if self.opts.corpus != self.opts.builtin_corpus {
            let (more_rpcs, more_configs) = corpus::load(&self.opts.corpus, &mut skipped);
            rpcs.extend(more_rpcs);
            configs.extend(more_configs);
        }
        for file in skipped {
            println!("corpus: skipped {file} (not a saved input)");
        }
        (rpcs, configs)
    }

    /// Fuzzes the selected RPCs against a fresh cluster.
    pub async fn rpcs(&mut self) -> anyhow::Result<()> {
        let methods = self.methods();
        if methods.is_empty() {
            return Ok(());
        }
        let mut pools = std::mem::take(&mut self.pools);
        let fuzzed = Fuzzed::start(&self.schema, &mut pools).await?;
        self.pools = pools;
        let mut readback = Readback::new(&self.schema, fuzzed.seeded.clone())?;
        let (saved, _) = self.saved();
        let mut replayed = 0;
        for input in &saved {
            let Some(method) = methods.iter().find(|m| m.label() == input.rpc) else {
                continue;
            };
            if let Some(reason) = input
                .messages
                .iter()
                .find_map(|m| safety::refuse(&method.input, m, &fuzzed.places))
            {
                println!("corpus: not sending {}: {reason}", input.file.display());
                continue;
            }
            let call = Call {
                messages: input.messages.clone(),
                credential: input.credential,
                person: None,
                keep_open: false,
            };
            self.exercise(&fuzzed, method, call).await;
            replayed += 1;
        }
        if replayed > 0 {
            println!("corpus: replayed {replayed} saved inputs");
        }
        let mut rngs: Vec<Rng> = methods
            .iter()
            .map(|m| Rng::for_stream(self.opts.seed, &m.path))
            .collect();
        let mut done = 0u64;
        let started = Instant::now();
        let mut said = Instant::now();
        while done < self.opts.inputs {
            let round = ROUND.min(self.opts.inputs - done);
            for (method, rng) in methods.iter().zip(rngs.iter_mut()) {
                for _ in 0..round {
                    self.generated(&fuzzed, method, rng).await;
                }
            }
            done += round;
            self.between_rounds(&fuzzed, &mut readback, done >= self.opts.inputs)
                .await;
            if said.elapsed() >= PROGRESS_EVERY {
                said = Instant::now();
                println!(
                    "progress: {done}/{} inputs per RPC, {:.0} s, {} findings",
                    self.opts.inputs,
                    started.elapsed().as_secs_f64(),
                    self.findings.len()
                );
            }
        }
        Ok(())
    }

    async fn between_rounds(&mut self, fuzzed: &Fuzzed, readback: &mut Readback, last: bool) {
        for finding in readback.check(&fuzzed.target, last).await {
            self.record(finding, None);
        }
        if let Some(problem) = fuzzed.canary_problem() {
            self.record(
                Finding {
                    rpc: "canary".into(),
                    kind: "escape",
                    detail: problem,
                    evidence: Evidence::None,
                },
                None,
            );
        }
        for panic in oracle::take_panics() {
            self.record(
                Finding {
                    rpc: "background".into(),
                    kind: "panic",
                    detail: panic,
                    evidence: Evidence::None,
                },
                None,
            );
        }
    }

    /// One generated input for `method`.
    async fn generated(&mut self, fuzzed: &Fuzzed, method: &Method, rng: &mut Rng) {
        let count = if method.client_streaming {
            rng.range(1, 3)
        } else {
            1
        };
        let mut messages = Vec::with_capacity(count);
        let mut mutated = false;
        for _ in 0..count {
            let src = Source {
                schema: &self.schema,
                pools: &self.pools,
                places: &fuzzed.places,
            };
            let mut chosen = None;
            for _ in 0..SAFE_TRIES {
                let (bytes, was_mutated) = generate::input(&src, rng, &method.input);
                if safety::refuse(&method.input, &bytes, &fuzzed.places).is_none() {
                    chosen = Some((bytes, was_mutated));
                    break;
                }
                self.stat(method).held += 1;
            }
            let (bytes, was_mutated) = chosen.unwrap_or_default();
            mutated |= was_mutated;
            messages.push(bytes);
        }
        if mutated {
            self.stat(method).mutated += 1;
        }
        let credential = credential(rng, method);
        let person = rng
            .chance(1, 25)
            .then(|| *rng.pick(&["admin", "nobody", "", "ghost", "a b"]));
        let keep_open = method.client_streaming && rng.chance(1, 2);
        let call = Call {
            messages,
            credential,
            person,
            keep_open,
        };
        self.exercise(fuzzed, method, call).await;
    }

    /// Sends one input and judges the outcome.
    async fn exercise(&mut self, fuzzed: &Fuzzed, method: &Method, call: Call) {
        let Call {
            messages,
            credential,
            person,
            keep_open,
        } = call;
        if messages
            .iter()
            .any(|m| safety::starts_process(&method.input, m))
            && self.limiter.acquire().await
        {
            self.stat(method).limited += 1;
        }
        let started = Instant::now();
        let outcome = fuzzed
            .target
            .call(
                method,
                messages.iter().cloned().map(Bytes::from).collect(),
                credential,
                person,
                keep_open,
            )
            .await;
        let elapsed = started.elapsed();
        for answer in &outcome.responses {
            self.pools.harvest(&self.schema, &method.output, answer);
        }
        let stats = self.stat(method);
        stats.inputs += 1;
        stats.busy += elapsed;
        stats.codes.insert(code_name(&outcome));
        let evidence = Evidence::Rpc {
            input_type: method.input.clone(),
            messages,
            credential,
        };
        for (kind, detail) in judge(method, credential, &outcome) {
            self.record(
                Finding {
                    rpc: method.label(),
                    kind,
                    detail,
                    evidence: evidence.clone(),
                },
                Some(method),
            );
        }
        for panic in oracle::take_panics() {
            self.record(
                Finding {
                    rpc: method.label(),
                    kind: "panic",
                    detail: format!("during or just after this call: {panic}"),
                    evidence: evidence.clone(),
                },
                Some(method),
            );
        }
    }

    fn stat(&mut self, method: &Method) -> &mut Stats {
        self.stats.entry(method.label()).or_default()
    }

    /// Keeps a finding (once per kind of problem), prints it and saves its
    /// input the first time.
    fn record(&mut self, finding: Finding, method: Option<&Method>) {
        if let Some(method) = method {
            self.stat(method).findings += 1;
        } else {
            self.stats.entry(finding.rpc.clone()).or_default().findings += 1;
        }
        let key = finding.key();
        if let Some(&i) = self.seen.get(&key) {
            if let Some(entry) = self.findings.get_mut(i) {
                entry.1 += 1;
            }
            return;
        }
        let saved = match corpus::save(&self.opts.corpus, &finding) {
            Ok(path) => path.map(|p| p.display().to_string()),
            Err(e) => Some(format!("(could not save: {e})")),
        };
        crate::report::finding(&finding, self.opts.seed, saved.as_deref());
        self.seen.insert(key, self.findings.len());
        self.findings.push((finding, 1));
    }

    /// Fuzzes the config loader: saved inputs, then `--inputs` new ones.
    pub async fn config(&mut self) -> anyhow::Result<()> {
        let keys = std::sync::Arc::new(Keys::new()?);
        let dir = tempfile::tempdir()?;
        let (_, saved) = self.saved();
        let mut cases: Vec<ConfigCase> = saved.into_iter().map(|(_, case)| case).collect();
        let mut rng = Rng::for_stream(self.opts.seed, CONFIG);
        let total = cases.len() as u64 + self.opts.inputs;
        let mut n = 0u64;
        while n < total {
            let case = if cases.is_empty() {
                config_fuzz::generate(&mut rng, &keys)
            } else {
                cases.remove(0)
            };
            n += 1;
            let started = Instant::now();
            let (keys2, path, case2) = (keys.clone(), dir.path().to_path_buf(), case.clone());
            let task = tokio::task::spawn_blocking(move || config_fuzz::run(&case2, &path, &keys2));
            let problem = match tokio::time::timeout(CONFIG_TIMEOUT, task).await {
                Ok(Ok(problem)) => problem.map(|p| ("config", p)),
                Ok(Err(e)) => Some(("panic", format!("the load task failed: {e}"))),
                Err(_) => Some(("hang", format!("loading took over {CONFIG_TIMEOUT:?}"))),
            };
            let stats = self.stats.entry(CONFIG.into()).or_default();
            stats.inputs += 1;
            stats.busy += started.elapsed();
            stats.codes.insert(if problem.is_some() { "problem" } else { "loaded/refused" }.into());
            let panics = oracle::take_panics();
            let problems = problem.into_iter().chain(
                panics.into_iter().map(|p| ("panic", p)),
            );
            for (kind, detail) in problems {
                let kind = if detail == "loading panicked" { "panic" } else { kind };
                self.record(
                    Finding {
                        rpc: CONFIG.into(),
                        kind,
                        detail,
                        evidence: Evidence::Config(case.clone()),
                    },
                    None,
                );
            }
        }
        Ok(())
    }

    /// Notes on the RPCs whose inputs are restricted.
    pub fn restricted(&self) -> String {
        format!(
            "commands (ToolRunner/Execute bash, ToolRunner/RunHook, MCP server commands) come only from a \
             list of harmless ones, writing tools get only paths inside the run's temporary directories, \
             and calls that may start a process run at most {}/s",
            self.opts.spawn_rate
        )
    }
}

/// Mostly the credential the RPC needs; sometimes the other token, none,
/// a malformed one or a wrong one.
fn credential(rng: &mut Rng, method: &Method) -> Credential {
    use agentry_runtime::auth::Role;
    let service_only = agentry_runtime::auth::required_role(&method.path) == Some(Role::Service);
    match rng.below(100) {
        0..=84 if service_only => Credential::Service,
        0..=84 => Credential::Client,
        85..=89 => Credential::Service,
        90..=92 => Credential::Client,
        93..=94 => Credential::Missing,
        95..=96 => Credential::Malformed,
        _ => Credential::Wrong,
    }
}

fn code_name(outcome: &Outcome) -> String {
    if outcome.hung.is_some() {
        return "hang".into();
    }
    match &outcome.status {
        None => "OK".into(),
        Some(status) => format!("{:?}", status.code()),
    }
}

/// Every oracle on one call: (kind, detail) of each problem.
fn judge(method: &Method, credential: Credential, outcome: &Outcome) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Some(hung) = outcome.hung {
        problems.push(("hang", format!("{hung} within {:?}", crate::target::CALL_TIMEOUT)));
        return problems;
    }
    if let Some(status) = &outcome.status
        && let Some(p) = oracle::status_problem(status)
    {
        problems.push(("bad status", p));
    }
    if let Some(p) = oracle::auth_problem(method, credential, outcome) {
        problems.push(("auth", p));
    }
    if let Some(p) = oracle::answer_problem(method, outcome) {
        problems.push(("bad answer", p));
    }
    problems
}
