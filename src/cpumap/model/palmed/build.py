"""Palmed's stages as resumable steps whose state is a JSON file (one pipeline job each).

``cpumap.model.palmed`` holds the algorithm, stage by stage; this module strings the stages
together. ``build_model`` runs them all in one process (tests, the simulated-machine
benchmarks); the pipeline runs each as its own Snakemake job, the two large planned stages as
checkpoints whose kernels are measured by parallel batch jobs (workflow/rules/model.smk):

==========  ==========================================  =====================================
stage       what it does                                pipeline job
==========  ==========================================  =====================================
singletons  every form alone (missing ones measured)    checkpoint ``palmed_pairs``, which
pairs       balanced pairs of the pair candidates       also plans the pairs; batches measured
                                                        by ``palmed_measure``
basic       classes of alike forms, basic instructions  ``palmed_basic``
core        core mapping: cutting-plane loop, measures  ``palmed_core``
            its own rounds (each depends on an LP)
mapping     saturating kernels, every form against      checkpoint ``palmed_mapping``; batches
            every saturating kernel                     measured by ``palmed_measure``
remaining   per-form LPs, refinement rounds (measure    ``fit_model``
            their own kernels), model.json
wide        vector forms beside a 512-bit form, where   ``fit_model``
            the host changes mode (``palmed.wide``)
==========  ==========================================  =====================================

The state does not hold measurements: it lists the kernels each stage asked for, and a job
that loads it asks ``measure`` for all of them again (the Measurer answers from the database,
measuring nothing). So every stage sees exactly the measurements it would see in one process,
the model comes out identical either way, and it can be rebuilt from the raw rows alone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpumap.isa import transition
from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import Kernel, Log, PalmedConfig, _nolog, resumed
from cpumap.model.palmed.core import Core, fit_core
from cpumap.model.palmed.dirty import above, calm_roles, roles
from cpumap.model.palmed.dirty import probe as dirty_probe
from cpumap.model.palmed.forms import select_mapping_kernels, select_saturating
from cpumap.model.palmed.kernels import (
    Basic,
    _text,
    interacting_pairs,
    non_additive,
    non_additive_note,
    pair_candidates,
    select_basic,
    select_pairs,
    singleton_kernels,
)
from cpumap.model.palmed.layout import layout_from_json, layout_json, layout_note, layout_probe
from cpumap.model.palmed.lp import _LPStats
from cpumap.model.palmed.modes import fit_modes
from cpumap.model.palmed.refit import _one_unit
from cpumap.model.palmed.remaining import fit_remaining
from cpumap.model.palmed.states import mode_widths, probe
from cpumap.model.palmed.training import training_kernels
from cpumap.model.resmodel import OWN, ResourceModel
from cpumap.store.files import write_json_atomic

Measure = Callable[[list[str]], Sequence[float]]

#: Stages in order; ``Build.done`` lists those finished.
STAGES = ("singletons", "pairs", "basic", "core", "mapping", "remaining")
STATE_VERSION = 3


@dataclass
class Build:
    """Everything one stage hands to the next (``meas`` is rebuilt by ``load``, not saved)."""

    config: PalmedConfig
    forms: list[str]
    meas: dict[str, float] = field(default_factory=dict)
    #: stage -> kernels it asked for that no earlier stage had (in asking order)
    asked: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    wall: dict[str, float] = field(default_factory=dict)
    lp: dict[str, dict[str, float]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    basic: Basic | None = None
    core: Core | None = None
    done: list[str] = field(default_factory=list)
    #: the caller's notes, carried from stage to stage (e.g. the forms left out and why)
    info: dict[str, Any] = field(default_factory=dict)
    #: form -> family (legacy SSE or 256-bit AVX, cpumap.isa.transition) of the forms no
    #: kernel may mix, where the host pays a penalty per switch between them; else empty
    apart: dict[str, str] = field(default_factory=dict)
    #: kernels never measured because they mix the families of ``apart`` (failed for the LPs)
    avoided: list[str] = field(default_factory=list)
    #: form -> vector length in bits (``transition.vector_lengths``): runs the wide probe
    widths: dict[str, int] = field(default_factory=dict)
    #: the wide probe's record (``palmed.wide.probe``); where ``observed``, the plain stages
    #: keep 512-bit and narrower vector forms apart and the wide stage fits them together
    wide_mode: dict[str, Any] = field(default_factory=dict)
    #: the dirty-upper probe's record and the roles it read (``palmed.dirty``): where
    #: ``observed``, the plain stages keep legacy-SSE and AVX forms apart
    dirty: dict[str, Any] = field(default_factory=dict)
    dirty_widths: dict[str, int] = field(default_factory=dict)
    #: layout-sensitive forms (``palmed.layout``) -> cycles a copy alone at each count
    layout: dict[str, dict[int, float]] = field(default_factory=dict)

    # ------------------------------------------------------------------ measuring

    def _keep_apart(self, kernels: Sequence[str], modes: bool = True) -> list[str]:
        """``kernels`` without those that mix the families of ``apart`` (``_apart``): known
        as NaN from now on, as failed kernels are (no LP uses them, no stage asks again).
        Their time would be the host's switching penalty, not their forms' throughput. Where
        the wide mode was seen (and ``modes``), also mixes of 512-bit and narrower vector
        forms: the wide stage's."""
        keep = []
        for k in kernels:
            if self._apart(parse_canonical(k), modes):
                if k not in self.meas:
                    self.meas[k] = math.nan
                    self.avoided.append(k)
            else:
                keep.append(k)
        return keep

    def _apart(self, kernel: Kernel, modes: bool = True) -> bool:
        return transition.mixes(kernel, self.apart) or (modes and self._in_mode(kernel))

    def _in_mode(self, kernel: Kernel) -> bool:
        """Whether a kernel mixes the forms of a mode seen (512-bit, dirty upper): the plain
        uses do not hold there."""
        return any(rec.get("observed") and transition.mixes_512(kernel, w) for rec, w in
                   ((self.wide_mode, self.widths), (self.dirty, self.dirty_widths)))

    def run(self, stage: str, kernels: Sequence[str], measure: Measure, log: Log) -> None:
        """Measure the kernels of ``kernels`` not known yet, as one round of ``stage``."""
        todo = sorted({k for k in self._keep_apart(kernels, modes=not stage.startswith("wide"))
                       if k not in self.meas})
        if todo:
            self.calls[stage] = self.calls.get(stage, 0) + 1
            self._store(todo, measure(list(todo)))
            self.asked.setdefault(stage, []).extend(todo)
        self.counts[stage] = self.counts.get(stage, 0) + len(todo)
        log(f"{stage}: measured {len(todo)} kernels")

    def _store(self, kernels: Sequence[str], values: Sequence[float]) -> None:
        if len(values) != len(kernels):
            raise RuntimeError(f"measure returned {len(values)} values for {len(kernels)}")
        for k, v in zip(kernels, values, strict=True):
            # a kernel that could not be measured stays known as NaN: never asked again,
            # left out of every LP (on hardware a few mixed memory kernels fail)
            ok = math.isfinite(v) and v > 0
            self.meas[k] = float(v) if ok else math.nan
            if not ok:
                self.failed.append(k)

    @property
    def singletons(self) -> dict[str, float]:
        return {f: self.meas[_text({f: 1})] for f in self.forms}

    def _finish(self, stage: str, t0: float) -> None:
        self.wall[stage] = self.wall.get(stage, 0.0) + time.perf_counter() - t0
        self.done.append(stage)

    def _need(self, stage: str) -> None:
        i = STAGES.index(stage)
        if self.done != list(STAGES[:i]):
            raise RuntimeError(f"Palmed stage {stage} needs {list(STAGES[:i])} done first; "
                               f"done: {self.done}")

    # ------------------------------------------------------------------ stages

    @classmethod
    def start(cls, forms: Sequence[str], measure: Measure, config: PalmedConfig | None = None,
              log: Log = _nolog, apart: Mapping[str, str] | None = None,
              widths: Mapping[str, int] | None = None,
              carriers: Sequence[str] | None = None, first: Sequence[str] = (),
              plain: Set[str] | None = None, encodings: Mapping[str, str] | None = None,
              dirty: tuple[Mapping[str, str], Sequence[str]] | None = None) -> Build:
        """Stage 1: every form alone; forms whose singleton failed are dropped. ``apart``:
        the families of forms no kernel may mix (see the field); ``widths``: the forms'
        vector lengths, for the wide probe (``palmed.wide``), run here, with a carrier among
        ``carriers`` (None: any 512-bit form), the mode then kept to the ``encodings`` whose
        probes it slows; ``first`` and ``plain``: the pair candidates' order; ``dirty``: the
        forms' families and the 256-bit carriers, for the dirty-upper probe
        (``palmed.dirty``; None on a host that pays a penalty per switch)."""
        t0 = time.perf_counter()
        known = set(forms)
        b = cls(config=config or PalmedConfig(), forms=sorted(known),
                apart={f: fam for f, fam in sorted((apart or {}).items()) if f in known},
                widths={f: int(w) for f, w in sorted((widths or {}).items())
                        if f in known and w})
        b.run("singletons", singleton_kernels(b.forms), measure, log)
        ok = [f for f in b.forms if math.isfinite(b.meas[_text({f: 1})])]
        b.dropped = [f for f in b.forms if f not in ok]
        b.forms = ok
        if len(ok) < 2:
            raise RuntimeError(f"fewer than two forms measured ok (failed: {b.dropped})")
        while True:
            need, b.layout = layout_probe(b.forms, b.meas, b.config.tol)
            if not need:
                break
            b.run("layout", need, measure, log)
        if b.layout:
            log(f"layout: {len(b.layout)} forms whose time depends on the code layout, "
                f"approximate: {' '.join(sorted(b.layout))}")
        b.candidates = pair_candidates({f: t for f, t in b.singletons.items()
                                        if f not in b.layout}, b.config.max_pair_forms,
                                       first, plain)
        if widths is not None:
            record = b._probe("wide", lambda: probe(
                b.forms, b.widths, b.singletons, b.meas, b.candidates, b.config, carriers,
                encodings), measure, log)
            b.wide_mode, b.widths = record, mode_widths(b.widths, record, encodings)
        if dirty is not None:
            b.dirty_widths = roles({f: v for f, v in dirty[0].items() if f in known},
                                   above(b.wide_mode, b.widths))
            b.dirty = b._probe("dirty", lambda: dirty_probe(
                b.forms, b.dirty_widths, b.singletons, b.meas, b.candidates, b.config,
                dirty[1]), measure, log)
            b.dirty_widths = calm_roles(b.dirty_widths, b.dirty)
        b._finish("singletons", t0)
        return b

    def _probe(self, stage: str, step: Callable[[], tuple[list[str], dict[str, Any] | None]],
               measure: Measure, log: Log) -> dict[str, Any]:
        """A mode's probe (``step``: ``states.probe`` or ``dirty.probe`` on this build's
        measurements), measured to its end."""
        while True:
            need, record = step()
            if record is not None:
                log(f"{stage}: mode {'seen' if record['observed'] else 'not seen'}: {record}")
                return record
            self.run(stage, need, measure, log)

    def pair_kernels(self, probes: Sequence[str] | None = None) -> list[str]:
        """The balanced pairs stage 2 measures (those not known yet)."""
        s = self.singletons
        cand_t = {f: s[f] for f in self.candidates}
        pairs = select_pairs(cand_t, max_mult=self.config.max_mult, probes=probes)
        return [k for k in self._keep_apart(pairs) if k not in self.meas]

    def pairs(self, measure: Measure, log: Log = _nolog,
              probes: Sequence[str] | None = None) -> None:
        self._need("pairs")
        t0 = time.perf_counter()
        self.run("pairs", self.pair_kernels(probes), measure, log)
        self._finish("pairs", t0)

    def classes(self, log: Log = _nolog) -> None:
        """Stage 3: classes of forms that behave alike and the basic instructions."""
        self._need("basic")
        t0 = time.perf_counter()
        s = self.singletons
        cand_t = {f: s[f] for f in self.candidates}
        self.basic = select_basic(cand_t, self.meas, tol=self.config.tol,
                                  max_basic=self.config.max_basic, max_mult=self.config.max_mult)
        log(f"classes: {len(self.basic.classes)}; basic: {' '.join(self.basic.basic)}")
        self._finish("basic", t0)

    def core_mapping(self, measure: Measure, log: Log = _nolog) -> None:
        """Stage 4: the core loop, one measurement round per pass (each depends on an LP)."""
        self._need("core")
        assert self.basic is not None
        t0 = time.perf_counter()
        st = _LPStats()
        state: list[Any] = []
        while True:
            step = fit_core(self.basic, self.singletons, self.meas, state=state,
                            config=self.config, log=log, lp_stats=st)
            state = step.state
            if step.done:
                break
            self.run("core", step.need, measure, log)
        self.core = step.result
        self.lp["core"] = {"solves": st.solves, "seconds": st.seconds}
        self._finish("core", t0)

    def _mapping_sets(self) -> tuple[list[str], list[str], list[str]]:
        """Stages 5-6: the saturating kernels, every form against each, training kernels."""
        assert self.core is not None
        s = self.singletons
        saturating = select_saturating(self.core, self.meas, s, self.config)
        return ([_text(k) for k, _ in saturating],
                select_mapping_kernels(saturating, self.forms, s, self.meas, self.config),
                self.training())

    def training(self, wide: bool = False) -> list[str]:
        """The joint refit's random kernels (``training.training_kernels``), or the wide
        stage refit's (``wide``: each holds a 512-bit form): never held out."""
        steady = [f for f, t in self.singletons.items() if f not in self.layout and t > 0]
        mode = self.wide_mode.get("observed") and {f for f in steady if self.widths.get(f) == 512}
        return training_kernels(steady, self.config, self._apart, mode or None)[wide]

    def mapping_kernels(self) -> list[str]:
        """The kernels stages 5-6 measure (not known yet), and the wide training kernels (the
        batch jobs measure them; stage 8 finds them stored)."""
        sat, mixes, training = self._mapping_sets()
        return sorted({k for k in self._keep_apart(sorted({*sat, *mixes, *training}))
                       if k not in self.meas} | set(self.training(wide=True)))

    def mapping(self, measure: Measure, log: Log = _nolog) -> None:
        self._need("mapping")
        t0 = time.perf_counter()
        # run() skips what is known: the saturating kernels among the mixes count once; a
        # second pass measures the lighter proportions the balanced mixes asked for
        # (select_mapping_kernels screens), none when everything is known (a rebuild)
        while True:
            sat, mixes, training = self._mapping_sets()
            if all(k in self.meas for k in [*sat, *mixes, *training]):
                break
            self.run("saturating", sat, measure, log)
            self.run("mapping", mixes, measure, log)
            self.run("training", training, measure, log)
        self._finish("mapping", t0)

    def remaining(self, measure: Measure, log: Log = _nolog,
                  provenance: Mapping[str, Any] | None = None,
                  ) -> tuple[ResourceModel, dict[str, Any]]:
        """Stage 7: per-form LPs and refinement rounds; the model and the statistics.

        The model's provenance holds only deterministic facts (config, basic instructions,
        classes, defining and saturating kernels, kernel counts), so that rebuilding from the
        same measurements gives an identical file; timings go to the statistics.
        """
        self._need("remaining")
        assert self.core is not None and self.basic is not None
        t0 = time.perf_counter()
        st = _LPStats()
        state: list[Any] = []
        training = set(self.training())  # drawn once: the rounds do not change it
        # the modes' probe kernels tell nothing of the plain uses: known as failed here, as
        # those the plain stages kept apart are (the rounds add none)
        modal = {t for t, m in self.meas.items()
                 if math.isfinite(m) and self._in_mode(parse_canonical(t))}
        while True:
            meas = self.meas if not modal else {
                t: math.nan if t in modal else m for t, m in self.meas.items()}
            step = fit_remaining(self.core, self.forms, self.singletons, meas, state=state,
                                 classes=self.basic.classes, config=self.config, log=log,
                                 lp_stats=st, unsteady=set(self.layout), training=training)
            state = step.state
            if step.done:
                break
            self.run("refine", step.need, measure, log)
        rho_idx, defining, saturating, behaviour, own = step.result
        self.lp["remaining"] = {"solves": st.solves, "seconds": st.seconds}
        self._finish("remaining", t0)

        core, basic, singletons = self.core, self.basic, self.singletons
        # classes whose resources of their own are one unit (the divider's) share the first's
        # (not by the modes' probe kernels: the plain uses do not hold there)
        unit = _one_unit(rho_idx, own, meas, self.config.tol)
        own = {f: (unit.get(rep, rep), v) for f, (rep, v) in own.items()}  # (unit, use)
        odd = non_additive(singletons, meas, self.config.tol, classes=behaviour)
        names = [f"R{r:02d}" for r in range(len(defining))]
        # a class's resource of its own (``refit._owned``), named after its representative
        rho = {f: {names[r]: v for r, v in sorted(rho_idx.get(f, {}).items())}
               | ({OWN + own[f][0]: own[f][1]} if f in own else {}) for f in self.forms}
        model = ResourceModel(
            resources=names + sorted({OWN + rep for rep, _ in own.values()}), rho=rho,
            provenance={
                "method": "palmed",
                "config": self.config.as_dict(),
                "basic": basic.basic,
                "classes": {rep: members for rep, members in sorted(basic.classes.items())
                            if len(members) > 1},
                "n_classes": len(basic.classes),
                # forms alike against every saturating kernel: one fitted, the others take
                # its uses
                "behaviour_classes": dict(sorted(behaviour.items())),
                "resources": {n: {"defining": _text(d), "saturating": _text(s),
                                  "stage": "core" if i < core.n_resources else "refine"}
                              for i, (n, d, (s, _t)) in enumerate(zip(names, defining,
                                                                      saturating, strict=True))},
                "kernels": dict(self.counts),
                "layout_sensitive": layout_json(self.layout),
                "approximate": {f: non_additive_note(f, *n) for f, n in sorted(odd.items())}
                | {f: layout_note(u) for f, u in sorted(self.layout.items())},
                # pairs slower together than in sequence: kernels holding one are outside
                # what a resource model can predict (predictions for them are flagged)
                "interacting": sorted(sorted(p) for p in interacting_pairs(
                    {f: singletons[f] for f in self.candidates}, self.meas,
                    self.config.tol, self.config.max_mult)),
                **dict(provenance or {}),
            })
        self.wide(model, measure, [t for _, t in saturating], log)
        stats = {"kernels": dict(self.counts), "total_kernels": sum(self.counts.values()),
                 "measure_rounds": dict(self.calls), "n_forms": len(self.forms),
                 "failed_kernels": len(self.failed), "failed_singletons": self.dropped,
                 "kernels_kept_apart": len(self.avoided), "one_unit": dict(sorted(unit.items())),
                 "n_pair_forms": len(self.candidates), "lp": dict(self.lp),
                 "wall_seconds": dict(self.wall), "n_resources": len(names),
                 "n_core_resources": core.n_resources, "n_basic": len(basic.basic),
                 "n_classes": len(basic.classes),
                 "n_behaviour_reps": len(self.forms) - sum(len(m) - 1
                                                            for m in behaviour.values()),
                 # its size, and whether it ran (noisy measurements within the budget)
                 "joint_refit": st.refit, "wide": model.provenance.get("wide"),
                 "wide_refit": self.lp.get("wide", {}).get("refit"),
                 "dirty_upper": model.provenance.get("dirty_upper"),
                 "layout_sensitive": sorted(self.layout),
                 "non_additive": {f: list(n) for f, n in sorted(odd.items())}}
        return model, stats

    def fit(self, measure: Measure, log: Log = _nolog, probes: Sequence[str] | None = None,
            provenance: Mapping[str, Any] | None = None) -> tuple[ResourceModel, dict[str, Any]]:
        """Every stage after ``start``, in this process and in order (``build_model``)."""
        self.pairs(measure, log, probes)
        self.classes(log)
        self.core_mapping(measure, log)
        self.mapping(measure, log)
        return self.remaining(measure, log, provenance)

    def wide(self, model: ResourceModel, measure: Measure, t_plain: Sequence[float],
             log: Log = _nolog) -> None:
        """Stage 8 (after ``remaining``, same job): the modes' uses (``modes.fit_modes``)."""
        fit_modes(self, model, measure, t_plain, log)

    # ------------------------------------------------------------------ state file

    def as_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "config": self.config.as_dict(), "forms": self.forms,
                "done": self.done, "asked": self.asked, "counts": self.counts,
                "calls": self.calls, "wall_seconds": self.wall, "lp": self.lp,
                "dropped": self.dropped, "candidates": self.candidates,
                "basic": self.basic.as_dict() if self.basic else None,
                "core": self.core.as_dict() if self.core else None,
                "info": self.info, "apart": self.apart, "avoided": self.avoided,
                "widths": self.widths, "wide_mode": self.wide_mode, "dirty": self.dirty,
                "dirty_widths": self.dirty_widths, "layout": layout_json(self.layout)}

    def save(self, path: Path) -> None:
        write_json_atomic(self.as_dict(), path)

    @classmethod
    def load(cls, path: Path, measure: Measure, config: PalmedConfig | None = None) -> Build:
        """The state saved by the previous stage's job, its measurements asked again;
        ``config``, if given, must be the saved one (a stage must not mix two builds)."""
        with open(path, encoding="utf-8") as handle:
            d = json.load(handle)
        if d.get("version") != STATE_VERSION:
            raise RuntimeError(f"{path}: Palmed state version {d.get('version')}, "
                               f"expected {STATE_VERSION}: rerun the model stages")
        cfg = resumed(PalmedConfig(**{k: tuple(v) if k == "betas" else v
                                      for k, v in d["config"].items()}), config, path)
        b = cls(config=cfg, forms=list(d["forms"]), asked={k: list(v) for k, v in
                                                         d["asked"].items()},
                counts=dict(d["counts"]), calls=dict(d["calls"]), failed=[],
                wall=dict(d["wall_seconds"]), lp=dict(d["lp"]), dropped=list(d["dropped"]),
                candidates=list(d["candidates"]),
                basic=Basic(**d["basic"]) if d["basic"] else None,
                core=Core.from_dict(d["core"]) if d["core"] else None,
                done=list(d["done"]), info=dict(d["info"]), apart=dict(d.get("apart", {})),
                widths=dict(d["widths"]), wide_mode=dict(d["wide_mode"]),
                dirty=dict(d.get("dirty", {})), dirty_widths=dict(d.get("dirty_widths", {})),
                layout=layout_from_json(d["layout"]))
        kernels = [k for stage in d["asked"].values() for k in stage]
        if kernels:
            b._store(kernels, measure(kernels))
        b._keep_apart(d.get("avoided", []))
        return b


def build_model(forms: Sequence[str], measure: Measure, *, config: PalmedConfig | None = None,
                log: Log = _nolog, probes: Sequence[str] | None = None,
                provenance: Mapping[str, Any] | None = None,
                apart: Mapping[str, str] | None = None,
                widths: Mapping[str, int] | None = None,
                dirty: tuple[Mapping[str, str], Sequence[str]] | None = None,
                ) -> tuple[ResourceModel, dict[str, Any]]:
    """Run every stage against ``measure`` in this process; return the model and statistics.

    ``stats``: kernels measured per stage (``kernels``), measurement rounds, LP solves and
    seconds per fitting stage (``lp``), wall seconds per stage. ``widths`` (form -> vector
    length in bits) runs the wide stage, ``dirty`` (families, 256-bit carriers) the
    dirty-upper probe and state (``Build.start``).
    """
    return Build.start(forms, measure, config, log, apart, widths,
                       dirty=dirty).fit(measure, log, probes, provenance)
