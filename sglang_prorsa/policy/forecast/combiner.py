"""The served forecast: a combination of the lifecycle forecast with two simple forecasters of the window series.

Beyond the paper. Appendix B builds W^P (Eq. 15) and A^D (B.7) bottom-up from per-trajectory probabilities and
corrects them multiplicatively (B.8); on steady loads from generators other than the project's own that forecast
loses to persistence. Per quantity -- the prefill ARRIVALS (W^P less the observed backlog, which the predictor keeps
adding in full, B.4 and B.6) and the decode admissions A^D -- three members forecast the next window:

* ``lifecycle``: the predictor's bias-corrected value (Appendix B, B.8);
* ``persistence``: the last closed window's realised value ("the next window repeats this one");
* ``timeseries``: a local level Kalman filter of the realised series (``LocalLevelKalman``).

Weights (Bates and Granger 1969, "The combination of forecasts", Oper. Res. Q. 20(4); discounted, after Stock and
Watson 2004, "Combination forecasts of output growth in a seven-country data set", J. Forecasting 23(6)): after each
scored window every member's absolute error and the realised value go into sums discounted by
delta = 0.5 ** (1 / half_life) per window; a member's recent WAPE is their ratio. Then:

    clearly behind:  (1 - margin) * recent_wape_i > min_j recent_wape_j      -> weight 0 (trimmed)
    the rest:        w_i proportional to 1 / recent_wape_i ** 2               (Bates and Granger's inverse MSE)

When only the best is left it is served alone (selection; ``member`` names it), else the rest are blended
(``member`` = "blend"). A selected member more than three times away from both others (steady windows) gives way to
the median of the three: recent accuracy does not foresee one member's one-window blow-up. A guard keeps the whole
never worse than persistence for long: the combination's own forecasts and persistence's are scored over a
half-life four times longer, and while the combination's WAPE there exceeds persistence's, persistence is served
(``guarded``); the combination is served (again) once it beats persistence by 10 %. On steady windows the guard
starts closed: the combination is served only once it has beaten persistence. On series where every member's
recent ranking is noise (bursty sync steps a trainer reports no rewards for), per-window selection chases the last
winner and loses to persistence; the guard catches that. Trimming the clearly worse members and selecting when one
dominates follows Timmermann 2006
("Forecast combinations", Handbook of Economic Forecasting 1, ch. 4): combining pays when the members are close,
selection when one is clearly ahead. Inside the margin the blend's error is at most the weighted mean of the
members' errors (|sum w_i f_i - y| <= sum w_i |f_i - y|), each at most 1 / (1 - margin) times the best's recent
WAPE. Ranking by WAPE (not summed error) keeps members scored on different windows comparable.

Defaults, chosen for generality rather than fitted to a workload: a half-life of 4 windows (40 s at S = 10 s) and a
margin of 0.2. A jump in the series is followed in two windows: on the jump window every member errs alike, on the
next one persistence and the Kalman filter are right, and a member that missed twice is then clearly behind. A
member whose own quality changes (the lifecycle forecast turning biased) loses its weight once its discounted WAPE
passes the others' by the margin: a few windows when the change is large. A longer half-life ranks more steadily
on noisy series but follows such changes proportionally later.

The recent WAPEs compare the members on the same windows: only windows in which every enabled member had a
forecast enter them (not the first, before persistence and the Kalman filter exist, nor the one after a pause, when
persistence has nothing to repeat); otherwise one large window seen by one member and not another would decide the
ranking. A member's ``wape`` (since start) is over every window it had a forecast in. Before any window has been
scored, persistence is served if it exists, else lifecycle.
Non-finite inputs are ignored (a NaN realised value leaves the state untouched), served values are never negative.
Pure: scalar arithmetic on window totals (no SGLang, torch or HTTP), microseconds per window and per serve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sglang_prorsa.policy.forecast.local_level import LocalLevelKalman

LIFECYCLE, PERSISTENCE, TIMESERIES, BLEND = "lifecycle", "persistence", "timeseries", "blend"
MEMBERS = (LIFECYCLE, PERSISTENCE, TIMESERIES)
COMBINATION = "combination"  # what the weights above serve, before the guard (a key of the forecasts at open)
GUARD_HALF_LIFE_FACTOR = 4.0  # the guard's half-life, in member half-lives: it judges the long run
GUARD_MARGIN = 0.1  # the combination is served again once it beats persistence by this much (hysteresis)
# A combination more than this factor away from every other member's forecast is replaced by the members' median
# (steady windows only: at a launch the members disagree by nature).
DISAGREEMENT_FACTOR = 3.0
_TINY = 1e-12  # floor of a recent WAPE in the inverse-square weights (several perfect members share the weight)


def finite_or_none(value: float | None) -> float | None:
    """A usable forecast or realised value: finite and clipped at 0 (token counts), else None."""
    if value is None or not math.isfinite(value):
        return None
    return max(0.0, float(value))


@dataclass(frozen=True, slots=True)
class MemberReport:
    forecast: float | None  # its forecast for the current window
    wape: float | None  # running WAPE since start, over the scored windows where it had a forecast
    recent_wape: float | None  # discounted WAPE (the weights' input)
    weight: float  # its share of the served value

    def to_dict(self) -> dict:
        return {"forecast": self.forecast, "wape": self.wape, "recent_wape": self.recent_wape, "weight": self.weight}


@dataclass(frozen=True, slots=True)
class ServedValue:
    member: str  # LIFECYCLE | PERSISTENCE | TIMESERIES | BLEND
    value: float
    members: dict[str, MemberReport]
    combination: float | None = None  # what the weights alone would serve (the guard scores it)
    guarded: bool = False  # persistence served because the combination has lost to it over the long run


class _MemberScore:
    __slots__ = ("error", "realised", "count", "total_error", "total_realised")

    def __init__(self) -> None:
        self.error = self.realised = self.count = 0.0  # discounted, over the windows every enabled member forecast
        self.total_error = self.total_realised = 0.0  # since start, over the windows this member forecast

    def add_total(self, forecast: float, realised: float) -> None:
        self.total_error += abs(forecast - realised)
        self.total_realised += realised

    def add_recent(self, delta: float, forecast: float | None, realised: float) -> None:
        self.error *= delta
        self.realised *= delta
        self.count *= delta
        if forecast is not None:
            self.error += abs(forecast - realised)
            self.realised += realised
            self.count += 1.0

    @property
    def scored(self) -> bool:
        return self.count > 0.0

    def rank(self) -> float:
        """Recent WAPE for ranking: 0 for a perfect record over empty windows, inf for errors with nothing realised."""
        if self.realised > 0.0:
            return self.error / self.realised
        return 0.0 if self.error == 0.0 else math.inf

    def recent_wape(self) -> float | None:
        return self.error / self.realised if self.realised > 0.0 else None

    def wape(self) -> float | None:
        return self.total_error / self.total_realised if self.total_realised > 0.0 else None


class ForecastCombiner:
    """One quantity's combination (the predictor keeps one for prefill arrivals, one for decode admissions)."""

    def __init__(self, half_life_windows: float = 4.0, selection_margin: float = 0.2,
                 members: tuple[str, ...] = MEMBERS, noise_half_life_windows: float = 12.0,
                 prior: str = PERSISTENCE, robust: bool = True, start_guarded: bool | None = None) -> None:
        if not (math.isfinite(half_life_windows) and half_life_windows > 0):
            raise ValueError(f"half_life_windows must be > 0, got {half_life_windows}")
        if not 0.0 <= selection_margin < 1.0:
            raise ValueError(f"selection_margin must be in [0, 1), got {selection_margin}")
        if not members or set(members) - set(MEMBERS):
            raise ValueError(f"members must be a non-empty subset of {MEMBERS}, got {members}")
        if prior not in (PERSISTENCE, LIFECYCLE):
            raise ValueError(f"prior must be {PERSISTENCE!r} or {LIFECYCLE!r}, got {prior!r}")
        self.prior = prior  # served before any window is scored (when it has a forecast), else lifecycle
        self.robust = robust  # the median replaces a combination that disagrees with every other member
        self.delta = 0.5 ** (1.0 / half_life_windows)
        self.margin = selection_margin
        self.enabled = tuple(m for m in MEMBERS if m in members)
        self.kalman = LocalLevelKalman(noise_half_life_windows)
        self.scores = {m: _MemberScore() for m in MEMBERS}  # every member is scored, enabled or not
        self.windows = 0
        # The guard: the combination against persistence over a longer half-life, on the windows both forecast.
        self.guard_delta = 0.5 ** (1.0 / (GUARD_HALF_LIFE_FACTOR * half_life_windows))
        self.guard_scores = {COMBINATION: _MemberScore(), PERSISTENCE: _MemberScore()}
        # Steady windows start guarded: the combination earns its place against persistence (a launch regime starts
        # unguarded: there persistence repeats a gap, and the lifecycle forecast is the one that models a launch).
        self.guarded = robust if start_guarded is None else start_guarded

    # ----- the members' forecasts -----
    def member_forecasts(self, lifecycle: float | None, persistence: float | None) -> dict[str, float | None]:
        return {LIFECYCLE: finite_or_none(lifecycle), PERSISTENCE: finite_or_none(persistence),
                TIMESERIES: finite_or_none(self.kalman.forecast)}

    # ----- a scored window closed -----
    def observe(self, realised: float, forecasts_at_open: Mapping[str, float | None]) -> bool:
        """Score the members' forecasts made at the window's start against its realised value and move the Kalman
        filter on. The caller passes only windows the accuracy tracker scores and no pause or step boundary
        touched. A non-finite or negative realised value is ignored (False)."""
        if realised is None or not math.isfinite(realised) or realised < 0:
            return False
        y = float(realised)
        forecasts = {m: finite_or_none(forecasts_at_open.get(m)) for m in MEMBERS}
        # the weights compare members on the same windows: those where every enabled member had a forecast
        common = all(forecasts[m] is not None for m in self.enabled)
        for name, score in self.scores.items():
            f = forecasts[name]
            if f is not None:
                score.add_total(f, y)
            if common:
                score.add_recent(self.delta, f, y)
        combination = finite_or_none(forecasts_at_open.get(COMBINATION))
        if combination is not None and forecasts[PERSISTENCE] is not None and PERSISTENCE in self.enabled:
            self.guard_scores[COMBINATION].add_recent(self.guard_delta, combination, y)
            self.guard_scores[PERSISTENCE].add_recent(self.guard_delta, forecasts[PERSISTENCE], y)
            self._update_guard()
        self.kalman.observe(y)
        self.windows += 1
        return True

    def _update_guard(self) -> None:
        """Persistence is served while the combination's long-run WAPE exceeds persistence's, and again the
        combination once it beats persistence by ``GUARD_MARGIN`` (so the two do not alternate on noise)."""
        mine, theirs = self.guard_scores[COMBINATION].rank(), self.guard_scores[PERSISTENCE].rank()
        if self.guarded:
            self.guarded = not mine < (1.0 - GUARD_MARGIN) * theirs
        else:
            self.guarded = mine > theirs

    def _median_if_alone(self, member: str, value: float, forecasts: Mapping[str, float | None]) -> str | None:
        """The member whose forecast is the median of three or more, when the selected one is more than
        ``DISAGREEMENT_FACTOR`` away from every other (a selection by recent accuracy does not foresee a member's
        one-window blow-up: a lifecycle forecast 40x the realised value was seen right after it ranked first)."""
        names = tuple(m for m in self.enabled if forecasts.get(m) is not None)
        others = [forecasts[m] or 0.0 for m in names if m != member]
        if len(names) < 3 or not others:
            return None
        far = all(value > DISAGREEMENT_FACTOR * o or o > DISAGREEMENT_FACTOR * value for o in others)
        return _median_member(forecasts, names) if far else None

    def trusts(self, member: str) -> bool:
        """Whether ``member`` would be kept by the weights here: not yet compared (no evidence against it), or not
        clearly behind the best on the recent windows (the trimming rule of ``weights``)."""
        ranked = [self.scores[m].rank() for m in self.enabled if self.scores[m].scored]
        if not self.scores[member].scored or not ranked:
            return True
        return (1.0 - self.margin) * self.scores[member].rank() <= min(ranked)

    # ----- what is served -----
    def weights(self, available: Mapping[str, float | None]) -> tuple[str, dict[str, float]]:
        """(member served or BLEND, weight per member) over the enabled members that have a forecast now."""
        ranked = sorted((self.scores[m].rank(), i, m) for i, m in enumerate(self.enabled)
                        if available.get(m) is not None and self.scores[m].scored)
        ranked = [r for r in ranked if math.isfinite(r[0])] or ranked[:1]
        if not ranked:  # nothing scored yet: the prior if it has a forecast, else lifecycle (the one always there)
            first = self.prior if self.prior in self.enabled and available.get(self.prior) is not None else LIFECYCLE
            return first, {first: 1.0}
        best_rank, _, best = ranked[0]
        close = [(r, m) for r, _, m in ranked if (1.0 - self.margin) * r <= best_rank]  # not clearly behind
        if len(close) == 1:
            return best, {best: 1.0}
        inverse = {m: 1.0 / max(r, _TINY) ** 2 for r, m in close}
        total = sum(inverse.values())
        return BLEND, {m: v / total for m, v in inverse.items()}

    def serve(self, lifecycle: float | None, persistence: float | None) -> ServedValue:
        """The served value for the current window, with every member's report."""
        forecasts = self.member_forecasts(lifecycle, persistence)
        member, weights = self.weights(forecasts)
        combination = max(0.0, sum(w * (forecasts[m] or 0.0) for m, w in weights.items()))
        if self.robust and member != BLEND:
            median = self._median_if_alone(member, combination, forecasts)
            if median is not None:
                member, combination = median, forecasts[median] or 0.0
                weights = {median: 1.0}
        value, guarded = combination, False
        persisted = forecasts[PERSISTENCE]
        if self.guarded and member != PERSISTENCE and persisted is not None and PERSISTENCE in self.enabled:
            member, weights, value, guarded = PERSISTENCE, {PERSISTENCE: 1.0}, persisted, True
        reports = {m: MemberReport(forecasts[m], self.scores[m].wape(), self.scores[m].recent_wape(),
                                   weights.get(m, 0.0)) for m in MEMBERS}
        return ServedValue(member, value, reports, combination, guarded)


def _median_member(forecasts: Mapping[str, float | None], names: tuple[str, ...]) -> str:
    ordered = sorted((forecasts[m] or 0.0, m) for m in names)
    return ordered[(len(ordered) - 1) // 2][1]


def lifecycle_served(value: float) -> ServedValue:
    """The lifecycle value served alone, with no member scored (a forecast made without a combiner)."""
    reports = {m: MemberReport(value if m == LIFECYCLE else None, None, None, 1.0 if m == LIFECYCLE else 0.0)
               for m in MEMBERS}
    return ServedValue(LIFECYCLE, value, reports)


def served_json(prefill: ServedValue, decode: ServedValue, regime: str = "steady") -> dict:
    """The ``served`` and ``members`` objects of ``/prorsa/forecast`` (``regime``: whose combiners served)."""
    return {
        "served": {"prefill": {"member": prefill.member, "arrival_tokens": prefill.value,
                               "guarded": prefill.guarded, "regime": regime},
                   "decode": {"member": decode.member, "admission_tokens": decode.value, "guarded": decode.guarded,
                              "regime": regime}},
        "members": {"prefill": {m: r.to_dict() for m, r in prefill.members.items()},
                    "decode": {m: r.to_dict() for m, r in decode.members.items()}},
    }
