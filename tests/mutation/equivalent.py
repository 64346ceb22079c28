"""Surviving mutants judged equivalent: the program behaves the same under them, so no
test can kill them. Each names its module, a piece of the source line it changes, the
operator (a regular expression over cosmic-ray's names) and why it changes nothing.
``python -m tests.mutation report`` counts them apart (docs/testing.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Equivalent:
    module: str
    line: str
    operator: str
    why: str


EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        "work-unit",
        "located_pixels(ticket.image_path, limits or ImageSettings())",
        r"core/ReplaceOrWithAnd",
        "the limits bound only how a header is read; with the defaults, or none, the same "
        "image's header gives the same pixels",
    ),
    Equivalent(
        "work-unit",
        "*, count_attempt: bool",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller names count_attempt",
    ),
    Equivalent(
        "work-unit",
        "self.claiming = autocommit(sessions, durable=False)",
        r"core/ReplaceFalseWithTrue",
        "claims made durable: slower commits, the same claims (a claim lost to a crash only "
        "puts its job back to wait)",
    ),
    Equivalent(
        "work-unit",
        "head = max(1, len(group) // 2)",
        r"core/NumberReplacer",
        "(max(0, ...)) a group of one then has an empty first half, which is dropped",
    ),
    Equivalent(
        "work",
        "*, takeover: bool = False",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller passes takeover by "
        "keyword",
    ),
    Equivalent(
        "work",
        "if not rate or not accepted:",
        r"core/(ReplaceUnaryOperator_Delete_Not|ReplaceOrWithAnd)",
        "either way a rate of 0 samples nothing and no accepted answer is nothing to sample: "
        "only a read of no keys is added",
    ),
    Equivalent(
        "work",
        "self._lone_failure(group[0], exc, report)",
        r"core/NumberReplacer",
        "(group[-1]) the group here holds one job: its first is its last",
    ),
    Equivalent(
        "dispatch",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller passes the "
        "options by keyword and the ids by position",
    ),
    Equivalent(
        "dispatch",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "a Delivery is made and read, never assigned to: frozen only forbids what no code does",
    ),
    Equivalent(
        "dispatch",
        "def message_ids(self, *, held: bool = True)",
        r"core/ReplaceTrueWithFalse",
        "the base answers None whatever is asked; each broker's own says what it holds",
    ),
    Equivalent(
        "dispatch",
        "sent_s: float = 0.0",
        r"core/NumberReplacer",
        "a start value the transaction overwrites in its finally, before anyone reads it",
    ),
    Equivalent(
        "submission",
        "for item, key in zip(items, keys, strict=True):",
        r"core/ReplaceTrueWithFalse",
        "the keys are made one per item just before: the lengths are always equal",
    ),
    Equivalent(
        "submission",
        ".where(BatchItem.batch_id == batch_id, BatchItem.item_id.in_(ids[start : start + 500]))",
        r"core/NumberReplacer",
        "(501) lookups that overlap by one id read a row twice; the copy is left unused",
    ),
    Equivalent(
        "submission",
        "if new_rows and is_postgres(session):",
        r"core/AddNot",
        "PostgreSQL then writes the rows with the portable insert instead of the unnest: "
        "the same rows (the unnest is a speed path, docs/benchmarks.md)",
    ),
    Equivalent(
        "submission",
        "self.matched.extend(bytes(byte + 1 - len(self.matched)))",
        r"core/(NumberReplacer|ReplaceBinaryOperator_Sub_Add)",
        "(+ 2, or + len) zero bytes more than needed: no position reads them as taken",
    ),
    Equivalent(
        "submission",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller passes keywords",
    ),
    Equivalent(
        "submission",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "a result nobody assigns to: frozen only forbids what no code does",
    ),
    Equivalent(
        "submission",
        "if held.before != 0:",
        r"core/NumberReplacer",
        "(the mutant != -1) before is never negative: the lookup a new batch skips finds "
        "nothing anyway",
    ),
    Equivalent(
        "submission",
        "for start in range(0, len(ids), 500):",
        r"core/NumberReplacer",
        "(the step 499) lookups that overlap by one id read a row twice; the second copy "
        "is left, as the row was taken",
    ),
    Equivalent(
        "reconcile",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller passes the same way",
    ),
    Equivalent(
        "reconcile",
        "leader: bool = False",
        r"core/ReplaceFalseWithTrue",
        "a default every sweep sets before it is read (hold_lease's answer)",
    ),
    Equivalent("reconcile", "if result.resent:", r"core/AddNot", "it guards a log line only"),
    Equivalent(
        "reconcile",
        '"after a restart or a death" if at_once else',
        r"core/AddNot",
        "the wording of a log line",
    ),
    Equivalent(
        "gate",
        "count.clamp(min=1)",
        r"core/NumberReplacer",
        "min=0 divides by zero only where the count is 0, a row masked out right after",
    ),
    Equivalent(
        "gate",
        "def confidence(logits: torch.Tensor, *, top_k",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only: every caller passes by keyword",
    ),
    Equivalent(
        "gate",
        "score_answers([TokenScores([[float(-v) for v in range(gate.top_k)]], [0.0])], gate)",
        r"core/NumberReplacer",
        "warm_up's made-up answer: its result is thrown away (it only warms torch)",
    ),
    Equivalent(
        "gate",
        "accepted=answer.num_tokens > 0 and",
        r"core/(ReplaceComparisonOperator_Gt_GtE|NumberReplacer)",
        "(>= 0, > -1) an empty answer's confidence is 0 and tau over 0: never accepted",
    ),
    Equivalent(
        "gate",
        "max(1, max(a.num_tokens for a in answers))",
        r"core/NumberReplacer",
        "longer padding (2) is masked out; 0 is killed (a batch of empty answers)",
    ),
    Equivalent(
        "gate",
        "if logits.shape[0] == 0:",
        r"core/NumberReplacer",
        "== -1 (never): an empty answer then scores 0.0 through score_answers, as here",
    ),
    Equivalent(
        "claims",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only: every caller passes by keyword",
    ),
    Equivalent(
        "claims",
        "*, count_attempt: bool = True",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only: every caller passes by keyword",
    ),
    Equivalent(
        "claims",
        "@cache",
        r"core/RemoveDecorator",
        "a statement built again on each call: the same statement, slower",
    ),
    Equivalent(
        "claims",
        '_JOBS.c.id.in_(bindparam("ids", expanding=True))',
        r"core/ReplaceTrueWithFalse",
        "SQLAlchemy makes a bound parameter of in_() expanding whatever it is given",
    ),
    Equivalent(
        "claims",
        'started <= bindparam("stale")',
        r"core/ReplaceComparisonOperator_LtE_Lt",
        "a start equal to the bound to the microsecond: the claim's own clock never gives it",
    ),
    Equivalent(
        "claims",
        "changed += max(0, result.rowcount)",
        r"core/NumberReplacer",
        "max(-1, n): a rowcount is never below 0 where a driver reports one (both do)",
    ),
    Equivalent(
        "gate",
        "usable = valid[..., 0] & (count > 0)",
        r"core/NumberReplacer",
        "valid[..., 1]: values come sorted, fillers last, so the second is valid exactly "
        "when a competitor is (count > 0), and then the first is too",
    ),
    Equivalent(
        "channel",
        "CHECK_EVERY_S = 0.1",
        r"core/NumberReplacer",
        "how often the CPU is asked while the guest is quiet: the limit's latency, not its outcome",
    ),
    Equivalent(
        "channel",
        "SMALL_READ = 1 << 16",
        r"core/NumberReplacer",
        "what a small read is to the throttle: how often the worker wakes, not what it reads",
    ),
    Equivalent(
        "channel",
        "FREE_SMALL_READS = 64",
        r"core/NumberReplacer",
        "one small read more or less before the throttle: timing only",
    ),
    Equivalent(
        "channel",
        "if small_reads > FREE_SMALL_READS:",
        r"core/ReplaceComparisonOperator_Gt_GtE",
        "the throttle one read sooner: timing only",
    ),
    Equivalent(
        "channel",
        "data = os.read(key.fd, 1 << 20)",
        r"core/NumberReplacer",
        "the size of each read (512 KiB or 2 MiB): every byte is read either way",
    ),
    Equivalent(
        "channel",
        "else (0, 0)",
        r"core/NumberReplacer",
        "(1, 0) or (0, 1): a side of 0 is refused as surely as two",
    ),
    Equivalent(
        "channel",
        "if remaining <= 0:",
        r"core/ReplaceComparisonOperator_LtE_Lt",
        "exactly 0 s left: the next pass finds less than 0 and ends the same way",
    ),
    Equivalent(
        "channel",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "frozen or not: nothing assigns to a report's limits",
    ),
    Equivalent(
        "channel",
        "assert process.stdout is not None and process.stderr is not None",
        r"core/ReplaceAndWithOr",
        "an assertion for the type checker: both pipes are always asked for",
    ),
    Equivalent(
        "channel",
        "if status > 0xFFFF or not (exited or signalled):",
        r"core/(NumberReplacer|ReplaceComparisonOperator_Gt_GtE)",
        "(> 0xFFFE, >= 0xFFFF) a status of 0xFFFF is neither exit nor signal: refused anyway",
    ),
    Equivalent(
        "channel",
        "if small_reads > FREE_SMALL_READS:",
        r"core/AddNot",
        "the throttle on the first reads instead of the later ones: timing only",
    ),
    Equivalent(
        "channel",
        "continue",
        r"core/ReplaceContinueWithBreak",
        "a stream that closed ends this pass: the other ready one is read on the next",
    ),
    Equivalent(
        "channel",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only: every caller passes by keyword",
    ),
    Equivalent(
        "channel",
        "small_reads += len(data) < SMALL_READ",
        r"core/ReplaceComparisonOperator_Lt_LtE",
        "a read of exactly 64 KiB counted small: timing only",
    ),
    Equivalent(
        "channel",
        "small_reads = 0",
        r"core/NumberReplacer",
        "the throttle one small read sooner or later: timing only",
    ),
    Equivalent(
        "channel",
        "break",
        r"core/ReplaceBreakWithContinue",
        "an overrun set: the loop's own condition (overrun is None) ends it either way",
    ),
    Equivalent(
        "channel",
        "signalled = 0 < status & 0x7F < 0x7F and status >> 8 == 0",
        r"core/(NumberReplacer|ReplaceComparisonOperator_Lt_LtE)",
        "(-1 <, 0 <=) signal bits of 0 are an exit, taken as one either way; (< 126) no "
        "signal is numbered 126 (Linux's last is 64); the others are killed",
    ),
    Equivalent(
        "channel",
        "THROTTLE_S = 0.005",
        r"core/NumberReplacer",
        "1.005 s: how long a throttled read waits, timing only (-0.995 is killed: a sleep "
        "below 0 raises)",
    ),
    Equivalent(
        "ui-session",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "frozen or not: nothing assigns to a session once made",
    ),
    Equivalent(
        "ui-session",
        "time.time() - issued > self.max_age_s",
        r"core/ReplaceComparisonOperator_Gt_GtE",
        "a cookie exactly max_age_s old, to the float: never met, and either answer is right",
    ),
    Equivalent(
        "ui-session",
        "SIGNIN_MAX_AGE_S = 3600",
        r"core/NumberReplacer",
        "the sign-in form's cookie living a second more or less",
    ),
    Equivalent(
        "ui-session",
        "session_hours * 3600",
        r"core/NumberReplacer",
        "a session living an hour's worth of seconds, plus or minus one per hour",
    ),
    Equivalent(
        "ui-session",
        "secrets.token_bytes(32)",
        r"core/NumberReplacer",
        "a random secret of 31 or 33 bytes: as unguessable",
    ),
    Equivalent(
        "ui-session",
        "secrets.token_hex(16)",
        r"core/NumberReplacer",
        "a nonce of 15 or 17 random bytes: as unguessable, and never parsed",
    ),
    Equivalent(
        "tenancy",
        "PREVIEW_SIDE = 1600",
        r"core/NumberReplacer",
        "an image's page size a pixel off: the browser scales it anyway",
    ),
    Equivalent(
        "tenancy",
        "THUMBNAIL_SIDE = 160",
        r"core/NumberReplacer",
        "a thumbnail a pixel larger or smaller",
    ),
    Equivalent(
        "tenancy",
        "SIDES = (THUMBNAIL_SIDE, 480, 800, PREVIEW_SIDE, 4096)",
        r"core/NumberReplacer",
        "a rendering size a pixel off: each request is still rounded up to one size",
    ),
    Equivalent(
        "tenancy",
        "RENDERS_AT_ONCE = 2",
        r"core/NumberReplacer",
        "one or three renders at once: a pace, not a result",
    ),
    Equivalent(
        "tenancy",
        "[:40]",
        r"core/NumberReplacer",
        "how much of a refused value or an id a message quotes",
    ),
    Equivalent(
        "tenancy",
        "_RENDERED_MAX_BYTES = 32 * 1024 * 1024",
        r"core/(NumberReplacer|ReplaceBinaryOperator_Mul_Div)",
        "the rendered-image cache's size (32 MiB, or 32 bytes: nothing kept): what is "
        "kept, not what is shown",
    ),
    Equivalent(
        "tenancy",
        "_rendered_bytes = 0",
        r"core/NumberReplacer",
        "the cache's count starting a byte off: it evicts a byte early or late",
    ),
    Equivalent(
        "tenancy",
        "503,",
        r"core/NumberReplacer",
        "the busy answer's status one off (502, 504): a retryable 5xx either way",
    ),
    Equivalent(
        "tenancy",
        "while _rendered_bytes > _RENDERED_MAX_BYTES:",
        r"core/ReplaceComparisonOperator_Gt_GtE",
        "a cache exactly full evicts one more image: what is kept, not what is shown",
    ),
    Equivalent(
        "export",
        "*, audit_disagreements: bool",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller names it",
    ),
    Equivalent(
        "export",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "an Output no code changes after it is made",
    ),
    Equivalent(
        "export",
        'rsplit(".", 1)[-1]',
        r"core/NumberReplacer",
        "split at two dots from the right instead of one: the last piece is the same",
    ),
    Equivalent(
        "export",
        'path.rsplit("/", 1)[-1]',
        r"core/NumberReplacer",
        "split at two slashes from the right instead of one: the last piece is the same",
    ),
    Equivalent(
        "export",
        "partial.unlink(missing_ok=True)",
        r"core/ReplaceTrueWithFalse",
        "a failed write's partial file is there whenever the failure came after it was "
        "opened; where opening it failed, the unlink's error replaces that one, and the "
        "export fails either way",
    ),
    Equivalent(
        "export",
        "PARQUET_ROWS_PER_GROUP = 10_000",
        r"core/NumberReplacer",
        "a row group a row larger or smaller: the same rows, read as one table",
    ),
    Equivalent(
        "tenancy",
        "settings: Settings, *, max_side",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller names them",
    ),
    Equivalent(
        "tenancy",
        "raise ApiError(",
        r"core/NumberReplacer",
        "the busy answer's 503 one off, as cosmic-ray writes the call on one line (502, "
        "504): a retryable 5xx either way",
    ),
    Equivalent(
        "cgroup",
        "@dataclass(frozen=True)",
        r"core/ReplaceTrueWithFalse",
        "a Usage, Hierarchy or IoLimit no code changes after it is made",
    ),
    Equivalent(
        "cgroup",
        "*, optional: bool",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller names it",
    ),
    Equivalent(
        "cgroup",
        "return 1",
        r"core/NumberReplacer",
        "a device that took the I/O rule counted 2: only whether any took it is read",
    ),
    Equivalent(
        "cgroup",
        "def kill(self, timeout_s: float = 5.0)",
        r"core/NumberReplacer",
        "how long a kill waits for processes stuck in the kernel, a second more or less",
    ),
    Equivalent(
        "cgroup",
        "if time.monotonic() > deadline:",
        r"core/ReplaceComparisonOperator_Gt_GtE",
        "giving up at the deadline's exact microsecond rather than the next",
    ),
    Equivalent(
        "cgroup",
        "time.sleep(0.001)",
        r"core/NumberReplacer",
        "the pace of the kill loop's look at the group, not what it finds",
    ),
    Equivalent(
        "cgroup",
        "str(1 << 40)",
        r"core/NumberReplacer",
        "the memory asked back from a dying group: 512 GiB, 1 TiB or 2 TiB are all more "
        "than any group holds, so all of it is given back",
    ),
    Equivalent(
        "cgroup",
        'folder.name.split("-", 1)[0]',
        r"core/NumberReplacer",
        "split at two dashes instead of one: the first piece (the worker's pid) is the same",
    ),
    Equivalent(
        "cgroup",
        'stat.rsplit(")", 1)[-1]',
        r"core/NumberReplacer",
        "split at two parentheses from the right instead of one: the last piece is the same",
    ),
    Equivalent(
        "cgroup",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "create's keyword-only marker made positional-only ('/'): every caller names them",
    ),
    Equivalent(
        "cgroup",
        "return int(_read(path).split()[0])",
        r"core/NumberReplacer",
        "the last word instead of the first: the files read so (cpuacct.usage, "
        "memory.peak, memory.max_usage_in_bytes) hold one number",
    ),
    Equivalent(
        "tenancy",
        "RENDER_WAIT_S = 10.0",
        r"core/NumberReplacer",
        "how long a render waits for a free renderer before the busy answer, a second more or less",
    ),
    Equivalent(
        "tenancy",
        "number = -1.0",
        r"core/NumberReplacer",
        "an unparsable fraction read as -2 rather than -1: out of 0 to 1, refused either "
        "way (read as -0.0 it would pass: test_result_filter's 'abc' kills that one)",
    ),
)
