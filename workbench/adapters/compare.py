"""``wb.compare(...)``: the same pair and prompts on the workbench's engine and on a production engine.

    report = wb.compare(prompts=["def parse(line):", ...], max_new_tokens=64)   # vLLM in process
    print(report)                      # tokens, drafts, tau, per-position acceptance, tokens/s; the divergence
    report = wb.compare(..., workarounds=True)   # vLLM with workbench.adapters.vllm_workarounds applied

The report has three parts.
1. **Outputs**: every prompt's greedy tokens from the workbench's AR, the workbench's DFlash and vLLM's DFlash
   (and vLLM without speculation when ``vllm_ar=True``): lossless means all equal.
2. **Acceptance and speed**: drafts per request (verified proposals), committed tau (tokens per verify, the
   bonus included), per-position acceptance (the share of verifies that accepted at least d drafts), and
   tokens/s of each engine with the min-max over ``repeats`` interleaved repeats.
3. **Where drafts first differ** (only when they do): vLLM's drafter inputs and outputs at each cycle are
   held against the reference's (``workbench.models.drafter_reference``) for the same context, and at the first
   cycle whose drafts differ the report compares, from its own measurements:
   - every drafter input (``workbench.adapters.drafter_inputs``): the context's tokens and positions, the
     block's tokens and positions, against the committed context and the block the reference builds;
   - per slot: top-1 agreement and the largest log-prob gap between the two drafters;
   - per context-feature chunk (one per target layer the drafter reads): vLLM's feature vs the reference's
     for the same tokens (relative difference, RMS of each);
   - per drafter layer: the reference layer's attention and MLP run on vLLM's own inputs to that layer (its
     positions too), vs vLLM's outputs (so a difference there is the layer's computation, not its inputs').
     Where vLLM's context or block positions were not recorded or do not line up with the committed
     context, the reference's stand in for them, and the divergence says so (``layers_on_reference``).
   The verdict names the inputs, chunks and layers that differ, inputs first, and says only what it saw:
   a chunk or layer whose comparison could not be given the production's version of a differing input
   (a chunk is of the committed tokens, a layer may run on the reference's positions) is worded as
   following from that input; a layer that differs on the production's own inputs is the layer's own
   computation, whatever differs upstream. A table that could not be filled says why. Nothing in it knows
   what the causes are.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from workbench.adapters.drafter_inputs import aligned_context, compare_inputs
from workbench.models.drafter_reference import Reference, rel_diff, rms

EQUAL = 1e-3  # relative difference under which two float32 tensors count as the same tensor
DEPTHS = 4  # per-position acceptance reported for the first DEPTHS drafted slots


@dataclass
class EngineRun:
    """One engine's greedy run over the prompts: tokens and cycles' accept lengths per prompt."""

    name: str
    tokens: list  # per prompt: new token ids
    accepts: list  # per prompt: accepted drafts per verify (bonus not counted)
    committed: list  # per prompt: tokens committed per verify
    tokens_per_s: list = field(default_factory=list)  # per repeat, over all prompts

    @property
    def drafts(self) -> int:
        return sum(len(a) for a in self.accepts)

    @property
    def tau(self) -> float:
        n = self.drafts
        return sum(sum(c) for c in self.committed) / n if n else 0.0

    def per_position(self, depths: int = DEPTHS) -> list[float]:
        flat = [a for acc in self.accepts for a in acc]
        return [sum(a >= d for a in flat) / len(flat) if flat else 0.0 for d in range(1, depths + 1)]


@dataclass
class Divergence:
    """The first cycle whose drafts differ between the production engine and the reference."""

    prompt: int
    cycle: int
    position: int  # of the block's first slot
    slots: list  # per slot: {"slot", "agree", "ours", "theirs", "ours_text", "theirs_text", "logprob_gap"}
    chunks: list  # per feature chunk: {"chunk", "layer", "rel_diff", "rms_theirs", "rms_ours", "equal"}
    layers: list  # per drafter layer: {"layer", "attention", "mlp"} relative differences
    context_states: float | None = None  # rel diff of vLLM's fc output vs ours on vLLM's own features
    inputs: list = field(default_factory=list)  # per drafter input: InputCheck.to_dict()
    unfilled: dict = field(default_factory=dict)  # table ("features", "layers") -> why it has no rows
    # drafter inputs the layer comparison took from the reference because the production's were not recorded
    # or did not line up with the committed context ("context positions", "block positions")
    layers_on_reference: list = field(default_factory=list)

    @property
    def differing_inputs(self) -> list[str]:
        return [i["input"] for i in self.inputs if not i["equal"] and not i["missing"]]

    def layer_follows_input(self) -> list[str]:
        """The differing drafter inputs a layer's attention was run without (the reference's stood in): a layer
        difference there may be that input's, not the layer's."""
        return [n for n in self.layers_on_reference if n in self.differing_inputs]

    def own_attention_differs(self) -> bool:
        """A drafter layer's attention differs on the production's own inputs (no differing input stood in
        for): the layer's computation itself."""
        return not self.layer_follows_input() and any((lay.get("attention") or 0.0) > EQUAL for lay in self.layers)

    def verdict(self) -> list[str]:
        """What differs, inputs first; a difference a differing input explains is worded as following from it,
        and a layer that differs on the production's own inputs as the layer's own computation."""
        out = []
        differing = self.differing_inputs
        for i in self.inputs:
            if not i["equal"] and not i["missing"]:
                out.append(f"drafter input '{i['input']}' differs from the reference's: {i['differ']} of "
                           f"{i['compared']} values, first at {i['first']}")
        bad = [c for c in self.chunks if not c["equal"]]
        for c in bad:
            what = (f"context-feature chunk {c['chunk']} (target layer {c['layer']}) differs from the reference's "
                    f"feature: relative difference {c['rel_diff']:.3g}, RMS {c['rms_theirs']:.3g} (production) vs "
                    f"{c['rms_ours']:.3g} (reference)")
            if "context tokens" in differing:  # the reference's features are of the committed tokens
                out.append(f"{what}, which follows from the differing input above: the production's features are "
                           "of the context tokens it was handed, the reference's of the committed ones")
            else:
                out.append(f"{what}, for the same tokens")
        follows = self.layer_follows_input()
        stand_ins = [n for n in self.layers_on_reference if n not in follows]
        for lay in self.layers:
            v = lay.get("attention")
            if v is not None and v > EQUAL:
                head = f"drafter layer {lay['layer']} attention: output differs (relative difference {v:.3g})"
                if follows:
                    out.append(f"{head}, which follows from the differing input above: the reference layer ran on "
                               f"the reference's {' and '.join(follows)}, the production's could not be given to it")
                elif stand_ins:
                    out.append(f"{head} on the production's hidden states and context but the reference's "
                               f"{' and '.join(stand_ins)} (the production's were not recorded): the layer's "
                               "computation or those positions")
                else:
                    out.append(f"{head} on the production engine's own inputs to it (hidden states, context after "
                               "fc, positions): the layer's own computation"
                               + (f", not the differing {' and '.join(differing)} above, which it was given as the "
                                  "production's" if differing else ""))
            v = lay.get("mlp")
            if v is not None and v > EQUAL:
                out.append(f"drafter layer {lay['layer']} MLP: output differs (relative difference {v:.3g}) on the "
                           "production engine's own input to it: the layer's own computation")
        if self.context_states is not None and self.context_states > EQUAL:
            out.append(f"the drafter's fc over the production engine's own features differs "
                       f"(relative difference {self.context_states:.3g})")
        if not out:
            unchecked = [i["input"] for i in self.inputs if i["missing"]] + \
                [f"the {t} ({why})" for t, why in self.unfilled.items()]
            out.append("no drafter input, feature chunk or drafter layer differs beyond float noise"
                       + (f"; not compared: {', '.join(unchecked)}" if unchecked else
                          ": the difference is after the drafter's layers (its logits or the sampler)"))
        return out


@dataclass
class ComparisonReport:
    engine: str
    prompts: list
    runs: dict  # name -> EngineRun
    lossless: dict  # "name vs name" -> prompts equal / total
    same_drafts: tuple  # (cycles whose drafts equal the reference's, cycles compared)
    divergence: Divergence | None
    workarounds: tuple = ()
    seconds: float = 0.0

    def next_steps(self) -> list[str]:
        """What to do about what differs: the committed tau the differences cost here, and for each kind the
        verdict names, the workaround (``workbench.adapters.vllm_workarounds``) that removes it, if one does."""
        ref, prod = list(self.runs.values())[1:3]  # the workbench's DFlash (the reference) and the production's
        d = self.divergence
        if d is None:
            return [f"nothing: {prod.name} drafted the reference's tokens on every compared cycle (committed tau "
                    f"{prod.tau:.2f}, the reference's {ref.tau:.2f})"]
        out = [f"{prod.name} commits {prod.tau:.2f} tokens per verify here, the reference {ref.tau:.2f}: what differs "
               f"costs {ref.tau - prod.tau:.2f} committed tau"]
        kinds = []
        if any(not c["equal"] for c in d.chunks):
            kinds.append(("a context-feature chunk", "last_layer_feature"))
        if d.own_attention_differs():  # one that follows from a differing input is that input's
            kinds.append(("a drafter layer's attention", "per_layer_k_norm"))
        for what, fix in kinds:
            out.append(f"{what}: the {fix} workaround was on and it still differs; no other is known" if fix in
                       self.workarounds else f"{what}: wb.compare(..., workarounds=True) (bench --engine vllm "
                       f"--workarounds) applies {fix}, which removed that difference on vLLM 0.32.0")
        if not kinds:
            out.append("no known workaround removes what differs here: the verdict above says where to look")
        return out

    def to_dict(self) -> dict:
        return {
            "engine": self.engine, "workarounds": list(self.workarounds), "prompts": len(self.prompts),
            "next_steps": self.next_steps(),
            "lossless": self.lossless, "same_drafts": list(self.same_drafts),
            "runs": {k: {"drafts": r.drafts, "tau": r.tau, "per_position": r.per_position(),
                         "tokens_per_s": r.tokens_per_s} for k, r in self.runs.items()},
            "divergence": None if self.divergence is None else {
                **{k: getattr(self.divergence, k) for k in ("prompt", "cycle", "position", "inputs", "slots", "chunks",
                                                            "layers", "context_states", "unfilled",
                                                            "layers_on_reference")},
                "verdict": self.divergence.verdict()},
        }

    def __str__(self) -> str:
        from workbench.records.texttable import text_table as _table

        def text_table(headers, rows):
            return _table(headers, [[str(x) for x in r] for r in rows])

        lines = [f"Comparison: {self.engine}" + (f" with workarounds {', '.join(self.workarounds)}"
                                                   if self.workarounds else "") + f", {len(self.prompts)} prompts"]
        lines += [f"  tokens equal, {k}: {v}" for k, v in self.lossless.items()]
        rows = []
        for name, r in self.runs.items():
            tps = r.tokens_per_s
            speed = (f"{statistics.median(tps):.1f} [{min(tps):.1f}-{max(tps):.1f}]" if tps else "-")
            pp = " / ".join(f"{p:.2f}" for p in r.per_position())
            rows.append([name, r.drafts or "-", f"{r.tau:.2f}" if r.drafts else "-", pp if r.drafts else "-", speed])
        lines.append(text_table(["engine", "drafts", "committed tau", f"accepted at slot 1..{DEPTHS}",
                                 "tokens/s median [min-max]"], rows))
        same, total = self.same_drafts
        lines.append(f"drafts equal to the reference's for the same context: {same}/{total} cycles")
        d = self.divergence
        if d is None:
            lines.append("no divergence: every compared cycle drafted the reference's tokens")
        else:
            lines.append(f"first divergence: prompt {d.prompt}, cycle {d.cycle} (block at position {d.position})")
            lines.append(text_table(["drafter input", "values compared", "differ", "first difference"],
                                    [[i["input"], i["compared"] or "-", i["differ"] if not i["missing"] else "-",
                                      i["first"] or i["missing"] or "none"] for i in d.inputs]))
            lines.append(text_table(["slot", "top-1 agrees", "reference", "production", "largest log-prob gap"],
                                    [[s["slot"], "yes" if s["agree"] else "NO",
                                      f"{s['ours']} {s.get('ours_text', '')}".strip(),
                                      f"{s['theirs']} {s.get('theirs_text', '')}".strip(),
                                      f"{s['logprob_gap']:.3g}"] for s in d.slots]))
            lines.append(text_table(["feature chunk", "target layer", "rel. difference", "RMS production",
                                     "RMS reference", "same tensor"],
                                    [[c["chunk"], c["layer"], f"{c['rel_diff']:.3g}", f"{c['rms_theirs']:.3g}",
                                      f"{c['rms_ours']:.3g}", "yes" if c["equal"] else "NO"] for c in d.chunks]))
            if "features" in d.unfilled:
                lines.append(f"  (no feature chunk compared: {d.unfilled['features']})")
            lines.append(text_table(["drafter layer", "attention rel. diff", "MLP rel. diff"],
                                    [[lay["layer"], _fmt(lay.get("attention")), _fmt(lay.get("mlp"))]
                                     for lay in d.layers]))
            if "layers" in d.unfilled:
                lines.append(f"  (no drafter layer compared: {d.unfilled['layers']})")
            lines += ["verdict:"] + [f"  - {v}" for v in d.verdict()]
        lines += ["what next:"] + [f"  - {s}" for s in self.next_steps()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


def _fmt(v) -> str:
    return "not recorded" if v is None else f"{v:.3g}"


# ---------------------------------------------------------------------------------------------- the runs
def _ours(engine, prompt_ids: list, max_new_tokens: int, policy):
    s = engine.session(prompt_ids=prompt_ids, policy=policy, temperature=0.0, max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    t = s.run()
    return list(s.generated), t, time.perf_counter() - t0


def _theirs(vengine, prompt_ids: list, max_new_tokens: int, policy):
    s = vengine.session(prompt_ids=prompt_ids, policy=policy, max_new_tokens=max_new_tokens)
    t0 = time.perf_counter()
    t = s.run()
    return s, t, time.perf_counter() - t0


def _accepts(trace) -> tuple[list, list]:
    return [c.accept_length - 1 for c in trace.cycles], [c.committed for c in trace.cycles]


def compare(target=None, draft=None, prompts=None, *, max_new_tokens: int = 64, repeats: int = 3,
            workarounds: bool = False, engine: str = "vllm", vllm_ar: bool = False, localise: bool = True,
            progress=None) -> ComparisonReport:
    """Run the pair on the workbench's engine and on ``engine`` (``"vllm"``: in process) and compare.

    ``prompts``: texts (default: the first 8 of the shipped long evaluation split). ``repeats``: timed
    repeats, interleaved engine by engine (tokens, drafts and acceptance come from the first). ``vllm_ar``:
    also run vLLM without speculation (a second vLLM engine in this process)."""
    from workbench.engine.core import Engine
    from workbench.engine.loading import load_models
    from workbench.interface import registry

    texts = check_arguments(prompts, max_new_tokens, repeats, workarounds, engine, vllm_ar, localise)
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    models = load_models(target, draft, dtype="float32")
    ours = Engine(models)
    ids = [list(models.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in texts]
    say(f"{engine}: loading the pair (workarounds {'on' if workarounds else 'off'})")
    # Through the registry, as wb.load does (an installed package's engine too): the engine's own load refuses
    # an option it lacks, before loading. vLLM is asked for its workarounds and per-layer capture (the
    # localisation reads them); another engine only for what the caller asked of it.
    options = dict(workarounds=workarounds, layers=localise) if engine == "vllm" else (
        dict(workarounds=True) if workarounds else {})
    vengine = registry.load(engine, target, draft, **options)
    label = f"vLLM {vengine.version}" if engine == "vllm" else engine
    try:
        runs = {n: EngineRun(n, [], [], []) for n in ("workbench AR", "workbench DFlash", f"{label} DFlash")}
        sessions = timed_runs(ours, vengine, ids, max_new_tokens, repeats, runs, say)
        ar, df, vl = runs.values()
        lossless = {f"{df.name} vs {ar.name}": _equal(df.tokens, ar.tokens),
                    f"{vl.name} vs {ar.name}": _equal(vl.tokens, ar.tokens)}
        same, total, divergence = (0, 0, None)
        if localise and all(hasattr(s, "proposals") for s in sessions):  # only vLLM's sessions keep them
            say("comparing vLLM's drafts with the reference's, cycle by cycle")
            same, total, divergence = _localise(Reference(models), sessions, ids)
    finally:
        patches = tuple(getattr(vengine, "patches", ()))
        vengine.close()
    if vllm_ar:
        say("vLLM without speculation")
        vtoks = plain_tokens(engine, target, draft, ids, max_new_tokens)
        lossless[f"{label} AR vs {ar.name}"] = _equal(vtoks, ar.tokens)
    return ComparisonReport(label, texts, runs, lossless, (same, total), divergence,
                            patches, time.perf_counter() - t_start)


def check_arguments(prompts, max_new_tokens, repeats, workarounds, engine: str, vllm_ar, localise) -> list[str]:
    """Every argument of ``compare`` checked before either engine loads (ValueError, one line). -> the texts."""
    from workbench.shipped import default_prompts
    from workbench.engine import validate
    from workbench.interface import registry

    production = [n for n in registry.engine_names() if n != "workbench"]  # the report's other side
    if engine not in production:
        raise ValueError(f"engine={engine!r}: the in-process report runs a production engine ({', '.join(production)}); "
                         "for a server use workbench.adapters.served.compare_served(url, ...)")
    texts = validate.prompt_list(prompts) or default_prompts()
    validate.positive_int(max_new_tokens, "max_new_tokens")
    validate.positive_int(repeats, "repeats")
    for name, flag in (("workarounds", workarounds), ("vllm_ar", vllm_ar), ("localise", localise)):
        if not isinstance(flag, bool):  # "no" is truthy: it would turn the workarounds on
            raise ValueError(f"{name}={flag!r} must be True or False")
    if vllm_ar and engine != "vllm":
        raise ValueError(f"vllm_ar=True runs vLLM without speculation; engine={engine!r} is not vLLM: drop vllm_ar")
    if engine == "vllm":  # vLLM missing or of another version: said before the reference loads
        from workbench.adapters.vllm_tap import check_version

        check_version()
    return texts


def timed_runs(ours, vengine, ids: list, max_new_tokens: int, repeats: int, runs: dict, say) -> list:
    """The workbench's AR and DFlash and the production engine's DFlash on every prompt, ``repeats`` times,
    interleaved prompt by prompt; fills ``runs`` (tokens, accepts and committed from the first repeat, tokens/s
    per repeat). -> the production engine's sessions of the first repeat (the localisation reads them)."""
    from workbench.engine.policies import AR, DFlash

    ar, df, vl = runs.values()
    sessions = []
    say("warm-up: one short untimed run on each engine")  # first forwards of a process are slower
    _ours(ours, ids[0], 8, AR()), _ours(ours, ids[0], 8, DFlash()), _theirs(vengine, ids[0], 8, DFlash())
    for r in range(repeats):
        new = {k: 0 for k in runs}
        secs = {k: 0.0 for k in runs}
        for i, p in enumerate(ids):
            say(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(ids)}")
            toks, t, sec = _ours(ours, p, max_new_tokens, AR())
            new[ar.name] += len(toks); secs[ar.name] += sec
            if r == 0:
                ar.tokens.append(toks)
            toks, t, sec = _ours(ours, p, max_new_tokens, DFlash())
            new[df.name] += len(toks); secs[df.name] += sec
            if r == 0:
                df.tokens.append(toks)
                a, c = _accepts(t)
                df.accepts.append(a); df.committed.append(c)
            s, t, sec = _theirs(vengine, p, max_new_tokens, DFlash())
            new[vl.name] += len(s.generated); secs[vl.name] += sec
            if r == 0:
                vl.tokens.append(list(s.generated))
                a, c = _accepts(t)
                vl.accepts.append(a); vl.committed.append(c)
                sessions.append(s)
        for k in runs:
            runs[k].tokens_per_s.append(new[k] / secs[k] if secs[k] else 0.0)
    return sessions


def plain_tokens(engine: str, target, draft, ids: list, max_new_tokens: int) -> list:
    """The production engine without speculation (a second engine in this process): each prompt's tokens."""
    from workbench.interface import registry

    plain = registry.load(engine, target, draft, speculative=False)
    try:
        return [plain.generate(prompt_ids=p, max_new_tokens=max_new_tokens) for p in ids]
    finally:
        plain.close()


def _equal(a: list, b: list) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(b)} prompts"


# ---------------------------------------------------------------------------------------------- localise
def _localise(ref: Reference, sessions: list, ids: list) -> tuple[int, int, Divergence | None]:
    """Cycle by cycle, vLLM's drafts vs the reference drafter's for the same context; the first cycle
    that differs, localised to drafter inputs, feature chunks and drafter layers."""
    same = total = 0
    first = None
    for pi, (s, prompt) in enumerate(zip(sessions, ids)):
        for ci, (c, (proposal, row)) in enumerate(zip(s.trace.cycles, s.proposals)):
            context = (prompt + s.generated)[: c.start + 1]  # the committed tokens, the root last
            k = int(proposal.drafts.shape[1])
            ours_logits = ref.draft_logits(context, k)  # [k, V]
            total += 1
            if torch.equal(ours_logits.argmax(-1), proposal.drafts[row]):
                same += 1
                continue
            if first is not None:
                continue
            starts = [x.start for x in s.trace.cycles[: ci + 1]]
            aligned, short = aligned_context([p for p, _ in s.proposals[: ci + 1]], starts)
            first = _divergence(ref, pi, ci, c.start, context, ours_logits, proposal, row, aligned, short)
    return same, total, first


def _block_rows(t, row: int, q: int):
    """This request's [q] rows of a proposal's flat block tensor, or None when not recorded."""
    return None if t is None or t.shape[0] < (row + 1) * q else t[row * q:(row + 1) * q]


def _divergence(ref, pi, ci, start, context, ours_logits, proposal, row, aligned: dict, short: str) -> Divergence:
    k = ours_logits.shape[0]
    q_len = k + 1
    theirs_logits = proposal.draft_logits[row] if proposal.draft_logits is not None else None
    ours_lp = torch.log_softmax(ours_logits, -1)
    slots = []
    for j in range(k):
        theirs_tok = int(proposal.drafts[row, j])
        gap = (float((torch.log_softmax(theirs_logits[j], -1) - ours_lp[j]).abs().max())
               if theirs_logits is not None else float("nan"))
        ours_tok = int(ours_logits[j].argmax())
        slots.append({"slot": j + 1, "agree": ours_tok == theirs_tok, "ours": ours_tok, "theirs": theirs_tok,
                      "ours_text": repr(ref.models.tokenizer.decode([ours_tok])),
                      "theirs_text": repr(ref.models.tokenizer.decode([theirs_tok])), "logprob_gap": gap})
    block_pos = _block_rows(proposal.query_positions, row, q_len)
    inputs = compare_inputs(context, start, k, ref.models.mask_token_id, aligned,
                            _block_rows(proposal.query_tokens, row, q_len), block_pos)
    unfilled = {}
    chunks = []
    feats = aligned["context_features"]
    if feats is not None and feats.shape[0] == start:
        ours_chunks = ref.features(context[:-1])
        for j, (layer, ours) in enumerate(zip(ref.layer_ids, ours_chunks)):
            t = feats[:, j * ref.hidden:(j + 1) * ref.hidden].float()
            d = rel_diff(t, ours)
            chunks.append({"chunk": j, "layer": layer, "rel_diff": d, "rms_theirs": rms(t), "rms_ours": rms(ours),
                           "equal": d <= EQUAL})
    else:
        unfilled["features"] = ("vLLM's hooks recorded no target features" if feats is None else short or
                                f"{feats.shape[0]} feature rows for {start} context positions")
    layers, fc_diff, on_reference = [], None, []
    states = aligned["context_states"]
    if not proposal.layers:
        unfilled["layers"] = "the hooks kept no per-layer tensors (Tap(layers=True) records them)"
    elif states is None or states.shape[0] != start:
        unfilled["layers"] = ("vLLM's context after the drafter's fc was not recorded" if states is None else
                              f"vLLM's context after the drafter's fc has {states.shape[0]} rows for {start} "
                              f"context positions" + (f" ({short})" if short else ""))
    else:
        ctx_states = states.float()  # [P, H]: vLLM's fc output
        if feats is not None and feats.shape[0] == start:
            fc_diff = rel_diff(ctx_states, ref.fc(feats.float()))
        # the layers on vLLM's own positions, each part that was recorded and lines up: a wrong position is then
        # an input's difference; a part that was not stands in as the reference's, and the verdict says so
        ctx_pos = aligned["context_positions"]
        if ctx_pos is None or ctx_pos.shape[0] != start:
            ctx_pos = torch.arange(start)
            on_reference.append("context positions")
        if block_pos is None or block_pos.shape[0] != q_len:
            block_pos = torch.arange(start, start + q_len)
            on_reference.append("block positions")
        positions = torch.cat([ctx_pos.long(), block_pos.long()])
        rows = slice(row * q_len, (row + 1) * q_len)
        for li, io in enumerate(proposal.layers):
            entry = {"layer": li, "attention": None, "mlp": None}
            if "attn_in" in io:
                entry["attention"] = rel_diff(io["attn_out"][rows].float(),
                                              ref.attention(li, io["attn_in"][rows].float(), ctx_states, positions))
            if "mlp_in" in io:
                entry["mlp"] = rel_diff(io["mlp_out"][rows].float(), ref.mlp(li, io["mlp_in"][rows].float()))
            layers.append(entry)
    return Divergence(pi, ci, start, slots, chunks, layers, fc_diff, [i.to_dict() for i in inputs], unfilled,
                      on_reference)
