//! The walk over a parsed command line: statements, redirections, and the
//! commands that shells, `eval`, wrappers and `find -exec` run (the words
//! and their expansions are `words.rs`'s).

use super::*;
use brush_parser::word;

impl Walker {
    pub(super) fn doubt(&mut self, text: &str, why: String) {
        self.segments.push(Segment {
            text: text.trim().to_string(),
            kind: SegmentKind::Doubtful(why),
            words: Vec::new(),
        });
    }

    /// Parses shell source (a command line, a `$( )` body, a `bash -c`
    /// string) and walks it.
    pub(super) fn source(&mut self, source: &str) {
        if self.depth >= MAX_DEPTH {
            self.doubt(source, "the command nests too deeply to check".to_string());
            return;
        }
        let Some(text) = for_parser(source) else {
            self.doubt(
                source,
                "a here-document has no end word to check it by".to_string(),
            );
            return;
        };
        let options = self.options.clone();
        let parsed = std::panic::catch_unwind(|| {
            brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &options)
                .parse_program()
                .map_err(|e| e.to_string())
        })
        .unwrap_or_else(|_| Err("the shell parser failed".to_string()));
        match parsed {
            Ok(program) => {
                self.depth += 1;
                for list in &program.complete_commands {
                    self.compound_list(list);
                }
                self.depth -= 1;
            }
            Err(e) => self.doubt(source, format!("could not parse the command: {e}")),
        }
    }

    fn compound_list(&mut self, list: &ast::CompoundList) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &ast::Command) {
        match command {
            ast::Command::Simple(simple) => self.simple_command(simple),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound);
                self.redirect_list(redirects.as_ref());
            }
            ast::Command::Function(function) => {
                self.compound(&function.body.0);
                self.redirect_list(function.body.1.as_ref());
            }
            ast::Command::ExtendedTest(test, redirects) => {
                // `[[ $y -eq 1 ]]` evaluates y's value as arithmetic (and
                // so any array subscript in it as code).
                self.doubt(
                    &command.to_string(),
                    "[[ ]] may evaluate variables' values as arithmetic, which the policy cannot \
                     see"
                    .to_string(),
                );
                self.extended_test(&test.expr);
                self.redirect_list(redirects.as_ref());
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) {
        match compound {
            ast::CompoundCommand::Arithmetic(a) => self.arithmetic(&a.expr.value),
            ast::CompoundCommand::ArithmeticForClause(f) => {
                self.doubt(
                    &compound.to_string(),
                    "an arithmetic for loop evaluates variables' values as code".to_string(),
                );
                for expr in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&expr.value);
                }
                self.compound_list(&f.body.list);
            }
            ast::CompoundCommand::BraceGroup(b) => self.compound_list(&b.list),
            ast::CompoundCommand::Subshell(s) => self.compound_list(&s.list),
            ast::CompoundCommand::ForClause(f) => {
                for value in f.values.iter().flatten() {
                    self.word(&value.value);
                }
                self.compound_list(&f.body.list);
            }
            ast::CompoundCommand::CaseClause(c) => {
                self.word(&c.value.value);
                for case in &c.cases {
                    for pattern in &case.patterns {
                        self.word(&pattern.value);
                    }
                    if let Some(list) = &case.cmd {
                        self.compound_list(list);
                    }
                }
            }
            ast::CompoundCommand::IfClause(i) => {
                self.compound_list(&i.condition);
                self.compound_list(&i.then);
                for clause in i.elses.iter().flatten() {
                    if let Some(condition) = &clause.condition {
                        self.compound_list(condition);
                    }
                    self.compound_list(&clause.body);
                }
            }
            ast::CompoundCommand::WhileClause(w) | ast::CompoundCommand::UntilClause(w) => {
                self.compound_list(&w.0);
                self.compound_list(&w.1.list);
            }
            ast::CompoundCommand::Coprocess(c) => self.command(&c.body),
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr) {
        match expr {
            ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
                self.extended_test(a);
                self.extended_test(b);
            }
            ast::ExtendedTestExpr::Not(e) | ast::ExtendedTestExpr::Parenthesized(e) => {
                self.extended_test(e);
            }
            ast::ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(&w.value);
            }
            ast::ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(&a.value);
                self.word(&b.value);
            }
        }
    }

    fn redirect_list(&mut self, redirects: Option<&ast::RedirectList>) {
        for redirect in redirects.iter().flat_map(|r| r.0.iter()) {
            self.redirect(redirect);
        }
    }

    /// A redirection: the commands in its words, and, when it writes to a
    /// file, a segment such as `> out.txt` (a file write is not made safe
    /// by the command it follows: `echo x > ~/.bashrc`).
    fn redirect(&mut self, redirect: &ast::IoRedirect) {
        match redirect {
            ast::IoRedirect::File(_, kind, target) => match target {
                ast::IoFileRedirectTarget::Filename(w) => {
                    let word = self.word(&w.value);
                    match kind {
                        ast::IoFileRedirectKind::Write
                        | ast::IoFileRedirectKind::Append
                        | ast::IoFileRedirectKind::ReadAndWrite
                        | ast::IoFileRedirectKind::Clobber
                        | ast::IoFileRedirectKind::DuplicateOutput => {
                            self.file_write(&kind.to_string(), word);
                        }
                        ast::IoFileRedirectKind::Read | ast::IoFileRedirectKind::DuplicateInput => {
                            // bash opens a connection for these names.
                            if ["/dev/tcp/", "/dev/udp/"]
                                .iter()
                                .any(|p| word.text.starts_with(p))
                            {
                                self.doubt(
                                    &format!("< {}", word.text),
                                    "reads from a network connection".to_string(),
                                );
                            }
                        }
                    }
                }
                ast::IoFileRedirectTarget::Duplicate(w) => {
                    let word = self.word(&w.value);
                    // `>&2`, `2>&1`, `>&3-` duplicate descriptors; `>&file`
                    // writes to a file.
                    let descriptor = word
                        .text
                        .trim_end_matches('-')
                        .chars()
                        .all(|c| c.is_ascii_digit());
                    if !descriptor && matches!(kind, ast::IoFileRedirectKind::DuplicateOutput) {
                        self.file_write(&kind.to_string(), word);
                    }
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
                ast::IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.compound_list(&subshell.list);
                }
            },
            ast::IoRedirect::HereDocument(_, doc) => {
                let body = &doc.doc.value;
                if doc.requires_expansion && !body.contains(['$', '`']) {
                    // Nothing in it expands.
                } else if doc.requires_expansion && !brackets_balance(body) {
                    // The word parser backtracks exponentially over
                    // unclosed substitutions; bash would refuse them.
                    self.doubt(
                        body,
                        "a here-document has unclosed substitutions".to_string(),
                    );
                } else if doc.requires_expansion {
                    match word::parse_heredoc(body, &self.options) {
                        Ok(pieces) => {
                            let (mut text, mut literal) = (String::new(), true);
                            self.pieces(&doc.doc.value, &pieces, true, &mut text, &mut literal);
                        }
                        Err(e) => self.doubt(
                            &doc.doc.value,
                            format!("could not parse a here-document: {e}"),
                        ),
                    }
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                self.word(&w.value);
            }
            ast::IoRedirect::OutputAndError(w, append) => {
                let word = self.word(&w.value);
                self.file_write(if *append { "&>>" } else { "&>" }, word);
            }
        }
    }

    /// The segment of a redirection that writes to `target`: `> out.txt`.
    /// The null device and the standard streams need none.
    fn file_write(&mut self, operator: &str, target: ShellWord) {
        let text = format!("{operator} {}", target.text);
        if !target.literal {
            self.doubt(&text, "writes to a file whose name is computed".to_string());
        } else if !matches!(
            target.text.as_str(),
            "/dev/null" | "/dev/stdout" | "/dev/stderr"
        ) {
            self.segments.push(Segment {
                text,
                kind: SegmentKind::Command,
                words: Vec::new(),
            });
        }
    }

    fn assignment(&mut self, assignment: &ast::Assignment) {
        match &assignment.name {
            ast::AssignmentName::VariableName(_) => {}
            ast::AssignmentName::ArrayElementName(_, index) => self.arithmetic(index),
        }
        match &assignment.value {
            ast::AssignmentValue::Scalar(w) => {
                self.word(&w.value);
            }
            ast::AssignmentValue::Array(items) => {
                for (key, value) in items {
                    if let Some(key) = key {
                        self.word(&key.value);
                    }
                    self.word(&value.value);
                }
            }
        }
    }

    fn simple_command(&mut self, simple: &ast::SimpleCommand) {
        // The command's own segments come first, then those of the
        // substitutions in its words.
        let outer = std::mem::take(&mut self.segments);
        let mut assignments: Vec<ShellWord> = Vec::new();
        let mut words: Vec<ShellWord> = Vec::new();
        for item in simple.prefix.iter().flat_map(|p| p.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
                    self.assignment(a);
                    assignments.push(ShellWord {
                        text: w.value.clone(),
                        literal: false,
                    });
                }
                other => self.item(other, &mut words),
            }
        }
        if let Some(name) = &simple.word_or_name {
            let word = self.word(&name.value);
            words.push(word);
        }
        for item in simple.suffix.iter().flat_map(|s| s.0.iter()) {
            self.item(item, &mut words);
        }
        let inner = std::mem::replace(&mut self.segments, outer);
        if !assignments.is_empty() {
            // A value set here may be evaluated later as code (`${x@P}`,
            // `$((x))`, PATH, HOME, BASH_ENV, PROMPT_COMMAND…).
            self.doubt(
                &join(&assignments),
                "sets a variable, whose value bash or a program may later run as code".to_string(),
            );
        }
        if !words.is_empty() {
            if !assignments.is_empty() {
                let mut all = assignments;
                all.extend(words.iter().cloned());
                self.segments.push(Segment {
                    text: join(&all),
                    kind: SegmentKind::Command,
                    words: all.clone(),
                });
            }
            self.words(&words);
            if is_shell(basename(&words[0].text)) {
                self.shell_stdin(simple);
            }
        }
        self.segments.extend(inner);
    }

    /// A shell reading its commands from a here-document or here-string
    /// (`bash <<EOF`): the text is code, walked like a `bash -c` string.
    fn shell_stdin(&mut self, simple: &ast::SimpleCommand) {
        let items = simple
            .prefix
            .iter()
            .flat_map(|p| p.0.iter())
            .chain(simple.suffix.iter().flat_map(|s| s.0.iter()));
        for item in items {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereDocument(
                    _,
                    doc,
                )) => self.source(&doc.doc.value),
                ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereString(_, w)) => {
                    let word = self.word(&w.value);
                    let words = [word];
                    self.code(&words[0].text.clone(), &words);
                }
                _ => {}
            }
        }
    }

    /// A prefix or suffix item of a simple command; words go to `words`.
    fn item(&mut self, item: &ast::CommandPrefixOrSuffixItem, words: &mut Vec<ShellWord>) {
        match item {
            ast::CommandPrefixOrSuffixItem::IoRedirect(r) => self.redirect(r),
            ast::CommandPrefixOrSuffixItem::Word(w) => {
                let word = self.word(&w.value);
                words.push(word);
            }
            ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
                // An argument such as `export X=$(...)`.
                self.doubt(
                    &w.value,
                    "sets a variable, whose value bash or a program may later run as code"
                        .to_string(),
                );
                self.assignment(a);
                words.push(ShellWord {
                    text: w.value.clone(),
                    literal: false,
                });
            }
            ast::CommandPrefixOrSuffixItem::ProcessSubstitution(kind, subshell) => {
                self.compound_list(&subshell.list);
                words.push(ShellWord {
                    text: format!("{kind}{subshell}"),
                    literal: false,
                });
            }
        }
    }

    /// A simple command's words (command name first): its segment, and the
    /// commands it runs when it is a shell, `eval` or a wrapper.
    fn words(&mut self, words: &[ShellWord]) {
        let Some((name, args)) = words.split_first() else {
            return;
        };
        let text = join(words);
        if !name.literal {
            self.segments.push(Segment {
                text,
                kind: SegmentKind::Doubtful(format!(
                    "the command name is not a literal word: {}",
                    name.text
                )),
                words: Vec::new(),
            });
            return;
        }
        self.segments.push(Segment {
            text: text.clone(),
            kind: SegmentKind::Command,
            words: words.to_vec(),
        });
        let base = basename(&name.text);
        if let Some(why) = evaluates_later(base, args) {
            self.doubt(&text, why);
        }
        // Shells, eval and wrappers have their arguments read as commands
        // already.
        if !is_shell(base) && base != "eval" && wrapper_syntax(base).is_none() {
            self.option_values(args);
        }
        if base != name.text && !base.is_empty() {
            // `/usr/bin/sudo ls` is `sudo ls` to deny rules.
            let mut renamed = vec![ShellWord {
                text: base.to_string(),
                literal: true,
            }];
            renamed.extend(args.iter().cloned());
            self.segments.push(Segment {
                text: join(&renamed),
                kind: SegmentKind::DenyProbe,
                words: Vec::new(),
            });
        }
        match base {
            _ if is_shell(base) => self.shell(&text, args),
            "find" => self.find_actions(args),
            "eval" => {
                let args = match args.first() {
                    Some(first) if first.text == "--" => &args[1..],
                    _ => args,
                };
                self.code(&text, args);
            }
            _ => {
                if let Some(syntax) = wrapper_syntax(base) {
                    self.wrapper(&syntax, args);
                }
            }
        }
    }

    /// Arguments that read as commands (`--pager="rm -rf x"`, `-c 'rm
    /// x'`): a deny rule matches a denied command hiding in an option
    /// value. Only deny rules look at these probes.
    fn option_values(&mut self, args: &[ShellWord]) {
        // Values within values are probed a few levels deep; each level
        // parses its text once more.
        if self.probe_depth >= MAX_PROBE_DEPTH {
            return;
        }
        let mut probed = 0;
        for arg in args {
            let value = match arg.text.split_once('=') {
                Some((name, value)) if name.starts_with('-') || !name.contains(' ') => value,
                _ => arg.text.as_str(),
            };
            if !value.trim().contains(char::is_whitespace) && !value.contains([';', '|', '&']) {
                continue;
            }
            if probed == MAX_PROBES {
                break;
            }
            probed += 1;
            let before = self.segments.len();
            self.probe_depth += 1;
            self.source(value);
            self.probe_depth -= 1;
            for segment in &mut self.segments[before..] {
                segment.kind = SegmentKind::DenyProbe;
            }
        }
    }

    /// `find ... -exec CMD ... ;`: each command `find` runs is a segment.
    fn find_actions(&mut self, args: &[ShellWord]) {
        self.deeper(args, |walker| walker.find_commands(args));
    }

    fn find_commands(&mut self, args: &[ShellWord]) {
        let mut i = 0;
        while i < args.len() {
            if matches!(
                args[i].text.as_str(),
                "-exec" | "-execdir" | "-ok" | "-okdir"
            ) {
                let start = i + 1;
                let mut end = start;
                while end < args.len() && !matches!(args[end].text.as_str(), ";" | "+") {
                    end += 1;
                }
                if end > start {
                    self.words(&args[start..end]);
                }
                i = end;
            }
            i += 1;
        }
    }

    /// Runs `f` one level deeper, or doubts `args` when the walk is as deep
    /// as it may go.
    fn deeper(&mut self, args: &[ShellWord], f: impl FnOnce(&mut Self)) {
        if self.depth >= MAX_DEPTH {
            self.doubt(
                &join(args),
                "the command nests too deeply to check".to_string(),
            );
            return;
        }
        self.depth += 1;
        f(self);
        self.depth -= 1;
    }

    /// Shell code given as words (`eval` arguments, a `bash -c` string).
    fn code(&mut self, text: &str, words: &[ShellWord]) {
        if words.iter().all(|w| w.literal) {
            self.source(&join(words));
        } else {
            let why = "runs shell code that is not a literal string".to_string();
            // The command's own segment carries the doubt.
            match self
                .segments
                .iter_mut()
                .rev()
                .find(|s| s.text == text && s.kind == SegmentKind::Command)
            {
                Some(segment) => segment.kind = SegmentKind::Doubtful(why),
                None => self.doubt(text, why),
            }
        }
    }

    /// `bash [options] -c STRING ...`: the string is parsed too.
    fn shell(&mut self, text: &str, args: &[ShellWord]) {
        let mut has_c = false;
        let mut i = 0;
        while let Some(arg) = args.get(i) {
            let a = arg.text.as_str();
            if a == "--" {
                i += 1;
                break;
            }
            if matches!(a, "--rcfile" | "--init-file") {
                i += 2;
                continue;
            }
            if a.starts_with("--") {
                i += 1;
                continue;
            }
            if (a.starts_with('-') || a.starts_with('+')) && a.len() > 1 {
                has_c |= a.contains('c');
                i += if a.contains(['o', 'O']) { 2 } else { 1 };
                continue;
            }
            break;
        }
        if has_c && let Some(string) = args.get(i) {
            self.code(text, std::slice::from_ref(string));
        }
    }

    /// A wrapper (`env`, `sudo`, `timeout`, ...): the command it runs is a
    /// segment of its own; where an option may have been misread, other
    /// tails of its arguments are deny probes.
    fn wrapper(&mut self, syntax: &WrapperSyntax, args: &[ShellWord]) {
        self.deeper(args, |walker| walker.wrapped(syntax, args));
    }

    fn wrapped(&mut self, syntax: &WrapperSyntax, args: &[ShellWord]) {
        let Wrapped {
            start,
            split_string,
            certain,
        } = read_wrapper(syntax, args);
        if let Some(code) = split_string {
            let mut words = vec![ShellWord {
                text: code,
                literal: true,
            }];
            words.extend(args.iter().skip(start).cloned());
            self.code(&join(args), &words);
        }
        // Where the command may start if an option was misread: within the
        // options, and, when an option was unknown, a little further.
        let end = if certain {
            start.min(args.len())
        } else {
            start.saturating_add(MAX_PROBES).min(args.len())
        };
        for tail in (1..end).take(MAX_PROBES) {
            if tail != start && !args[tail].text.starts_with('-') {
                self.segments.push(Segment {
                    text: join(&args[tail..]),
                    kind: SegmentKind::DenyProbe,
                    words: Vec::new(),
                });
            }
        }
        if let Some(wrapped) = args.get(start..)
            && !wrapped.is_empty()
        {
            self.words(wrapped);
        }
    }
}

/// Why a command makes bash (or the program) run text as code later, or
/// changes what later commands run, in ways the policy cannot follow; `None`
/// for the others.
fn evaluates_later(base: &str, args: &[ShellWord]) -> Option<String> {
    let has = |flag: &str| args.iter().any(|a| a.text == flag);
    let subscript = || args.iter().any(|a| a.text.contains('['));
    let why = match base {
        "declare" | "typeset" | "local" | "export" | "readonly" | "let" => {
            format!("{base} sets variables or evaluates arithmetic")
        }
        "trap" => "trap runs its argument as code later".to_string(),
        "complete" | "compgen" if has("-C") || has("-F") => {
            format!("{base} -C/-F runs code on completion")
        }
        "mapfile" | "readarray" if has("-C") => format!("{base} -C runs a callback"),
        "printf" if args.iter().any(|a| a.text.starts_with("-v")) => {
            "printf -v sets a variable".to_string()
        }
        "read" | "unset" | "getopts" | "test" | "[" | "wait" if subscript() => {
            format!("{base} with an array subscript evaluates it as code")
        }
        "source" | "." => format!("{base} runs a file as shell code"),
        "alias" | "enable" | "bind" | "hash" | "shopt" | "set" if !args.is_empty() => {
            format!("{base} changes what later commands mean")
        }
        // Clearing or changing the environment undoes the sandbox's git
        // and Python settings.
        "env"
            if args
                .iter()
                .any(|a| a.text.starts_with('-') || a.text.contains('=')) =>
        {
            "env with options or assignments changes the command's environment".to_string()
        }
        "exec" if args.iter().any(|a| a.text.starts_with('-')) => {
            "exec with options changes the command's environment".to_string()
        }
        _ => return None,
    };
    Some(why)
}
