"""Evidence-exact questions over one tau-bench trajectory, generated from its tool results.

Every candidate names its answer terms and, for each, the evidence step that must hold it; candidates are
parsed from the tools' JSON (never from the dialogue's prose) and then checked (:func:`check_candidate`):

* every answer term occurs (whole word, case-insensitive; ``255.0`` also as ``255``) in its evidence step;
* every key the question names (reservation id, user id, flight number, date) occurs in the evidence;
* **no answer term occurs in any step that is not evidence** (the agent restating a price, a later lookup of
  the same reservation, the user quoting a card): such a question is dropped, so a context is sufficient
  exactly when it holds the evidence; multi-hop questions also drop when a non-evidence step holds both the
  question's key and the bridge value (another route to the answer);
* a question text generated twice in one episode (e.g. a reservation looked up before and after a change)
  is ambiguous and dropped.

Categories: ``single-hop`` (one tool result: a user profile, a reservation, a flight search, a calculation,
a tool error), ``multi-hop`` (a reservation's payment id resolved in the user's profile: two results), and
``temporal`` (how a reservation field changed between a lookup and a later update: both results, in order).
At most ``max_per_template`` questions per template and episode are kept, drawn with a seeded RNG.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from functools import lru_cache

from routers.memory.schema import QA, Episode

CATEGORIES = ("single-hop", "multi-hop", "temporal")
CABINS = ("basic_economy", "economy", "business")
RESERVATION_TOOLS = ("get_reservation_details", "book_reservation", "cancel_reservation", "update_reservation_flights",
                     "update_reservation_baggages", "update_reservation_passengers")


def _forms(term: str) -> list[str]:
    forms = [term]
    if re.fullmatch(r"-?\d+\.0+", term):
        forms.append(term.split(".")[0])
    return forms


@lru_cache(maxsize=4096)
def _pattern(term: str) -> re.Pattern:
    return re.compile("|".join(rf"(?<!\w){re.escape(f)}(?!\w)" for f in _forms(term)), re.I)


def occurs(term: str, text: str) -> bool:
    """``term`` as a whole word (or number) in ``text``, case-insensitive."""
    return bool(term) and _pattern(term).search(text) is not None


def _cand(category, template, question, answer, support: dict[int, list[str]], keys=(), bridge=None) -> dict:
    """``support``: evidence step -> answer terms that step must hold (evidence = its keys)."""
    return {"category": category, "template": template, "question": question, "answer": str(answer),
            "support": {i: [str(t) for t in ts] for i, ts in support.items()}, "keys": [str(k) for k in keys],
            "bridge": bridge}


def _h(cabin: str) -> str:
    return cabin.replace("_", " ")


# -- candidates per tool result ------------------------------------------------------------------------------
def user_candidates(t: dict) -> list[dict]:
    r, i = t["result"], t["step"]
    uid = t["args"].get("user_id")
    if not isinstance(r, dict) or not isinstance(uid, str):
        return []
    out = []
    for field, q in (("membership", "What is the membership tier of user {u}?"),
                     ("dob", "What is the date of birth of user {u}?"),
                     ("email", "What is the email address of user {u}?")):
        if isinstance(r.get(field), str):
            out.append(_cand("single-hop", f"user_{field}", q.format(u=uid), r[field], {i: [r[field]]}, [uid]))
    city = (r.get("address") or {}).get("city") if isinstance(r.get("address"), dict) else None
    if isinstance(city, str):
        out.append(_cand("single-hop", "user_city", f"In which city does user {uid} live?", city, {i: [city]}, [uid]))
    for pid, pm in (r.get("payment_methods") or {}).items() if isinstance(r.get("payment_methods"), dict) else ():
        if not isinstance(pm, dict):
            continue
        if pm.get("source") in ("gift_card", "certificate") and isinstance(pm.get("amount"), (int, float)):
            out.append(_cand("single-hop", "user_balance", f"What balance does {pid} of user {uid} hold?",
                             pm["amount"], {i: [pm["amount"]]}, [uid, pid]))
        if pm.get("source") == "credit_card" and isinstance(pm.get("last_four"), str):
            out.append(_cand("single-hop", "user_card_digits",
                             f"What are the last four digits of credit card {pid} of user {uid}?",
                             pm["last_four"], {i: [pm["last_four"]]}, [uid, pid]))
    return out


def reservation_candidates(t: dict) -> list[dict]:
    r, i = t["result"], t["step"]
    if not isinstance(r, dict) or not isinstance(r.get("reservation_id"), str):
        return []
    rid, out = r["reservation_id"], []
    if t["name"] == "book_reservation":
        fns = [f.get("flight_number") for f in r.get("flights") or [] if isinstance(f, dict)]
        uid = r.get("user_id")
        if fns and all(isinstance(f, str) for f in fns) and isinstance(uid, str):
            out.append(_cand("single-hop", "booked_id", f"Which reservation id did the booking of flight(s) "
                             f"{', '.join(fns)} for user {uid} get?", rid, {i: [rid]}, [uid, *fns]))
        return out
    if isinstance(r.get("cabin"), str):
        out.append(_cand("single-hop", "reservation_cabin", f"In which cabin class is reservation {rid} booked?",
                         r["cabin"], {i: [r["cabin"]]}, [rid]))
    if isinstance(r.get("created_at"), str):
        out.append(_cand("single-hop", "reservation_created", f"When was reservation {rid} created?",
                         r["created_at"], {i: [r["created_at"]]}, [rid]))
    o, d = r.get("origin"), r.get("destination")
    if isinstance(o, str) and isinstance(d, str) and o != d:
        out.append(_cand("single-hop", "reservation_route", f"Between which airports does reservation {rid} travel?",
                         f"from {o} to {d}", {i: [o, d]}, [rid]))
    for f in r.get("flights") or []:
        if isinstance(f, dict) and isinstance(f.get("price"), (int, float)) and isinstance(f.get("flight_number"), str):
            out.append(_cand("single-hop", "reservation_flight_price",
                             f"What price was paid for flight {f['flight_number']} on {f.get('date')} in reservation {rid}?",
                             f["price"], {i: [f["price"]]}, [rid, f["flight_number"]]))
    names = [f"{p.get('first_name')} {p.get('last_name')}" for p in r.get("passengers") or [] if isinstance(p, dict)]
    if names:
        terms = [x for p in r["passengers"] if isinstance(p, dict) for x in (p.get("first_name"), p.get("last_name"))]
        if all(isinstance(x, str) for x in terms):
            out.append(_cand("single-hop", "reservation_passengers", f"Who are the passengers on reservation {rid}?",
                             ", ".join(names), {i: terms}, [rid]))
    for p in r.get("payment_history") or []:
        if isinstance(p, dict) and isinstance(p.get("payment_id"), str) and isinstance(p.get("amount"), (int, float)):
            out.append(_cand("single-hop", "reservation_payment",
                             f"How much was paid with {p['payment_id']} for reservation {rid}?",
                             p["amount"], {i: [p["amount"]]}, [rid, p["payment_id"]]))
    return out


def _flight_questions(f: dict, date, i: int, rng: random.Random) -> list[dict]:
    fn = f.get("flight_number")
    if not isinstance(fn, str) or not isinstance(date, str):
        return []
    out = []
    prices, seats = f.get("prices") or {}, f.get("available_seats") or {}
    cabins = [c for c in CABINS if isinstance(prices, dict) and isinstance(prices.get(c), (int, float))]
    if cabins:
        c = rng.choice(cabins)
        out.append(_cand("single-hop", "search_price", f"What was the {_h(c)} fare of flight {fn} on {date}?",
                         prices[c], {i: [prices[c]]}, [fn, date]))
    cabins = [c for c in CABINS if isinstance(seats, dict) and isinstance(seats.get(c), int)]
    if cabins:
        c = rng.choice(cabins)
        out.append(_cand("single-hop", "search_seats", f"How many {_h(c)} seats were available on flight {fn} on {date}?",
                         seats[c], {i: [seats[c]]}, [fn, date]))
    dep = f.get("scheduled_departure_time_est")
    if isinstance(dep, str):
        out.append(_cand("single-hop", "search_departure", f"At what time (EST) is flight {fn} scheduled to depart on {date}?",
                         dep, {i: [dep]}, [fn, date]))
    return out


def search_candidates(t: dict, rng: random.Random) -> list[dict]:
    r, i, args = t["result"], t["step"], t["args"]
    if not isinstance(r, list):
        return []
    out = []
    for item in r:
        if isinstance(item, dict):  # a direct flight; the date is the search's
            out += _flight_questions(item, args.get("date"), i, rng)
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, dict) for x in item):
            a, b = item
            for leg in item:
                out += _flight_questions(leg, leg.get("date", args.get("date")), i, rng)
            via, fa, fb = a.get("destination"), a.get("flight_number"), b.get("flight_number")
            if isinstance(via, str) and isinstance(fa, str) and isinstance(fb, str):
                out.append(_cand("single-hop", "search_connection",
                                 f"Where does the connection from flight {fa} to flight {fb} on {a.get('date')} change planes?",
                                 via, {i: [via]}, [fa, fb]))
    return out


def other_candidates(t: dict) -> list[dict]:
    i, name, text = t["step"], t["name"], t["text"].strip()
    if name == "calculate" and isinstance(t["args"].get("expression"), str) and t["result"] is not None:
        return [_cand("single-hop", "calculation", f"What did the calculation {t['args']['expression']} return?",
                      text, {i: [text]}, [])]
    if text.startswith("Error:") and len(text) > len("Error: ") + 3:
        why = text[len("Error:"):].strip()
        return [_cand("single-hop", "tool_error", f"Why did the agent's {name} call fail?", why, {i: [why]}, [])]
    return []


# -- cross-result candidates ---------------------------------------------------------------------------------
def payment_candidates(records: dict[str, list[dict]], users: list[dict]) -> list[dict]:
    """multi-hop: the payment id of a reservation (its first record), resolved in a user profile."""
    out = []
    for rid, recs in records.items():
        t = recs[0]
        pids = sorted({p.get("payment_id") for p in t["result"].get("payment_history") or []
                       if isinstance(p, dict) and isinstance(p.get("payment_id"), str)})
        for u in users:
            methods = u["result"].get("payment_methods") if isinstance(u["result"], dict) else None
            if not isinstance(methods, dict):
                continue
            for pid in pids:
                pm = methods.get(pid)
                if not isinstance(pm, dict) or u["step"] == t["step"]:
                    continue
                kind = pm.get("source")
                same_kind = [p for p in pids if isinstance(methods.get(p), dict) and methods[p].get("source") == kind]
                if len(same_kind) != 1:
                    continue  # "the card" would be ambiguous
                support = {t["step"]: [], u["step"]: []}
                if kind == "credit_card" and isinstance(pm.get("last_four"), str):
                    support[u["step"]] = [pm["last_four"]]
                    out.append(_cand("multi-hop", "paid_card_digits", f"What are the last four digits of the credit "
                                     f"card charged for reservation {rid}?", pm["last_four"], support, [rid], pid))
                    if isinstance(pm.get("brand"), str):
                        out.append(_cand("multi-hop", "paid_card_brand", f"Which brand is the credit card charged for "
                                         f"reservation {rid}?", pm["brand"], {t["step"]: [], u["step"]: [pm["brand"]]},
                                         [rid], pid))
                elif kind in ("gift_card", "certificate") and isinstance(pm.get("amount"), (int, float)):
                    support[u["step"]] = [pm["amount"]]
                    out.append(_cand("multi-hop", "paid_balance", f"What balance did the {_h(kind)} used for "
                                     f"reservation {rid} hold in the user's profile?", pm["amount"], support, [rid], pid))
    return out


def _field(r: dict, field: str) -> list[str] | None:
    if field == "flights":
        fns = [f.get("flight_number") for f in r.get("flights") or [] if isinstance(f, dict)]
        return fns if fns and all(isinstance(f, str) for f in fns) else None
    v = r.get(field)
    return [str(v)] if isinstance(v, (str, int)) and not isinstance(v, bool) else None


def change_candidates(records: dict[str, list[dict]]) -> list[dict]:
    """temporal: a reservation field before and after an update call (the earlier and the later result)."""
    out = []
    for rid, recs in records.items():
        for prev, cur in zip(recs, recs[1:]):
            if not cur["name"].startswith("update_reservation"):
                continue
            for field, label in (("cabin", "cabin class"), ("flights", "flights"), ("total_baggages", "checked bags")):
                old, new = _field(prev["result"], field), _field(cur["result"], field)
                if old is None or new is None or old == new:
                    continue
                gone, added = [x for x in old if x not in new] or old, [x for x in new if x not in old] or new
                show = (lambda xs: ", ".join(_h(x) for x in xs))
                out.append(_cand("temporal", f"change_{field}", f"How did the {label} of reservation {rid} change "
                                 f"with the {cur['name']} call?", f"from {show(gone)} to {show(added)}",
                                 {prev["step"]: gone, cur["step"]: added}, [rid]))
    return out


# -- checks and selection ------------------------------------------------------------------------------------
def check_candidate(ep: Episode, c: dict) -> str | None:
    """Why ``c`` is not evidence-exact (a reason key), or None when it is."""
    evidence = set(c["support"])
    text = {i: ep.steps[i].text for i in range(len(ep.steps))}
    if not c["answer"].strip() or not any(c["support"].values()):
        return "empty_answer"
    for i, terms in c["support"].items():
        if not all(occurs(term, text[i]) for term in terms):
            return "answer_not_in_evidence"
    ev_text = "\n".join(text[i] for i in evidence)
    if not all(occurs(k, ev_text) for k in c["keys"]):
        return "key_not_in_evidence"
    terms = [term for ts in c["support"].values() for term in ts]
    others = [i for i in text if i not in evidence]
    if any(occurs(term, text[i]) for i in others for term in terms):
        return "answer_outside_evidence"
    if c["bridge"] and any(occurs(c["bridge"], text[i]) and all(occurs(k, text[i]) for k in c["keys"]) for i in others):
        return "bridge_outside_evidence"
    return None


def episode_questions(ep: Episode, tools: list[dict], seed: int = 0, max_per_template: int = 3) -> tuple[list[QA], dict]:
    """(questions, counts of candidates dropped by reason) for one trajectory; deterministic for a seed."""
    rng = random.Random(f"{seed}:{ep.episode_id}")
    cands: list[dict] = []
    records: dict[str, list[dict]] = defaultdict(list)
    users = []
    for t in tools:
        if t["name"] == "get_user_details":
            cands += user_candidates(t)
            users.append(t)
        elif t["name"] in RESERVATION_TOOLS and isinstance(t["result"], dict):
            cands += reservation_candidates(t)
            if isinstance(t["result"].get("reservation_id"), str):
                records[t["result"]["reservation_id"]].append(t)
        elif t["name"] in ("search_direct_flight", "search_onestop_flight"):
            cands += search_candidates(t, rng)
        else:
            cands += other_candidates(t)
    cands += payment_candidates(records, users) + change_candidates(records)
    dropped: Counter = Counter()
    times = Counter(c["question"] for c in cands)
    kept = []
    for c in cands:
        why = "ambiguous_question" if times[c["question"]] > 1 else check_candidate(ep, c)
        if why:
            dropped[why] += 1
        else:
            kept.append(c)
    by_template: dict[str, list[dict]] = defaultdict(list)
    for c in kept:
        by_template[c["template"]].append(c)
    chosen = []
    for template in sorted(by_template):
        group = by_template[template]
        if len(group) > max_per_template:
            dropped["over_template_cap"] += len(group) - max_per_template
            group = rng.sample(group, max_per_template)
        chosen += group
    chosen.sort(key=lambda c: (max(c["support"]), c["template"], c["question"]))
    qas = [QA(qa_id=f"{ep.episode_id}/q{n}", question=c["question"], answer=c["answer"],
              evidence=[ep.steps[i].step_id for i in sorted(c["support"])], category=c["category"],
              meta={"template": c["template"], "answer_terms": [t for ts in c["support"].values() for t in ts],
                    "keys": c["keys"], **({"bridge": c["bridge"]} if c["bridge"] else {})})
           for n, c in enumerate(chosen)]
    return qas, dict(dropped)
