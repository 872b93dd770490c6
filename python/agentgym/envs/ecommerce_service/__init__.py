"""``ecommerce_service``: customer-service agent for a simulated online shop.

A customer writes in (refund, exchange, damaged item, shipping problem, warranty claim,
cancellation). The agent classifies the inquiry, looks up the customer's orders, reads the
policy book, takes the one resolution the policy prescribes (or declines), and replies.
Tasks are generated from the task index (facts and correct resolution) and the seed (the
customer's wording). Scoring is in :meth:`ECommerceServiceEnv._score` and the README.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.base import action_line
from agentgym.envs.commands import CommandEnv

CATEGORIES = ("refund", "exchange", "damaged", "shipping", "warranty", "cancellation")
W_CLASSIFY, W_RESOLVE, W_REPLY, PENALTY = 0.2, 0.6, 0.2, 0.3
REFUND_DAYS, ELECTRONICS_REFUND_DAYS, EXCHANGE_DAYS, DAMAGE_DAYS = 30, 15, 45, 14
LATE_GRACE_DAYS, WARRANTY_DAYS = 3, 365

POLICY = {
    "refund": f"Refunds: items may be returned for a refund within {REFUND_DAYS} days of "
    f"delivery ({ELECTRONICS_REFUND_DAYS} days for electronics). Final-sale items cannot be "
    "refunded. Refund the item price times the quantity; shipping fees are not refunded. "
    "Action: refund[ORDER_ID, AMOUNT]. If not eligible: deny[ORDER_ID].",
    "exchange": f"Exchanges: apparel and shoes may be exchanged for another size of the same "
    f"item within {EXCHANGE_DAYS} days of delivery if unworn. Final-sale items cannot be "
    "exchanged. Action: exchange[ORDER_ID, ITEM, NEW_SIZE]. If not eligible: deny[ORDER_ID].",
    "damaged": f"Damaged or wrong items: must be reported within {DAMAGE_DAYS} days of "
    "delivery (final-sale items included). The customer chooses: refund of the item price "
    "times the quantity (refund[ORDER_ID, AMOUNT]) or a replacement (replace[ORDER_ID, ITEM]). "
    "Reported later: deny[ORDER_ID].",
    "shipping": f"Shipping: an order in transit up to {LATE_GRACE_DAYS} days past its "
    "estimated delivery date is still on its way: take no action, just reply with the "
    f"estimate. More than {LATE_GRACE_DAYS} days past the estimate it counts as lost: "
    "reship[ORDER_ID].",
    "warranty": f"Warranty: electronics carry a {WARRANTY_DAYS}-day warranty from delivery "
    "against defects: warranty_claim[ORDER_ID, ITEM]. Other items, or electronics past the "
    "warranty, are not covered: deny[ORDER_ID].",
    "cancellation": "Cancellation: an order that is still processing (not yet shipped) can "
    "be cancelled with a full refund: cancel[ORDER_ID]. Orders already shipped cannot be "
    "cancelled: deny[ORDER_ID] (the customer may return the items after delivery).",
}

CATALOG = {
    "apparel": [("T-shirt", 12, 30), ("Hoodie", 30, 70), ("Jeans", 35, 90),
                ("Rain jacket", 50, 150), ("Wool sweater", 40, 110)],
    "shoes": [("Running shoes", 50, 160), ("Leather boots", 80, 220), ("Sandals", 20, 60)],
    "electronics": [("Bluetooth headphones", 40, 300), ("Smartwatch", 90, 400),
                    ("Tablet", 150, 700), ("Portable speaker", 30, 200),
                    ("Wireless charger", 15, 60)],
    "kitchen": [("Blender", 30, 150), ("Ceramic mug set", 15, 45), ("Chef's knife", 25, 120),
                ("Cast-iron pan", 25, 80)],
    "home": [("Desk lamp", 20, 90), ("Throw blanket", 25, 80), ("Picture frame", 10, 40),
             ("Scented candle", 8, 30)],
}
SIZES = {"apparel": ["XS", "S", "M", "L", "XL"], "shoes": [str(s) for s in range(6, 13)]}
FIRST = ["Dana", "Luis", "Priya", "Tom", "Mei", "Omar", "Sara", "Jonas", "Aisha", "Ken",
         "Elena", "Raj", "Chloe", "Ivan", "Nora", "Sam"]
LAST = ["Lee", "Garcia", "Patel", "Novak", "Chen", "Haddad", "Berg", "Okafor", "Sato", "Rossi"]

INSTRUCTIONS = """You are a customer-service agent for an online shop. Resolve the customer's \
inquiry according to the policy book. Actions:
  classify[CATEGORY]        refund | exchange | damaged | shipping | warranty | cancellation
  list_orders               the customer's orders (ids, dates, items)
  lookup_order[ORDER_ID]    details of one order (items, prices, dates, status)
  check_policy[TOPIC]       the policy for a topic (same names as the categories)
  refund[ORDER_ID, AMOUNT]  refund AMOUNT dollars
  exchange[ORDER_ID, ITEM, NEW_SIZE]
  replace[ORDER_ID, ITEM]   ship a replacement
  reship[ORDER_ID]          re-send a lost order
  warranty_claim[ORDER_ID, ITEM]
  cancel[ORDER_ID]
  deny[ORDER_ID]            decline the request as not covered by policy
  reply[TEXT]               final answer to the customer; ends the conversation
Score: right category, the one resolution the policy prescribes with the right parameters (or \
no resolution when none is due), and a reply that names the order id. Wrong resolutions \
(e.g. refunding an ineligible order) are penalised.""" + action_line("list_orders")


@dataclass
class Item:
    name: str
    category: str
    price: float
    qty: int = 1
    size: str | None = None
    final_sale: bool = False


@dataclass
class Order:
    order_id: str
    placed: dt.date
    status: str  # processing | in_transit | delivered
    items: list[Item]
    shipping_fee: float
    delivered: dt.date | None = None
    eta: dt.date | None = None

    def describe(self) -> str:
        if self.status == "delivered":
            st = f"delivered {self.delivered}"
        elif self.status == "in_transit":
            st = f"in transit, estimated delivery {self.eta}"
        else:
            st = "processing (not yet shipped)"
        lines = [f"Order {self.order_id}: placed {self.placed}, status: {st}, shipping fee "
                 f"${self.shipping_fee:.2f}"]
        for k, it in enumerate(self.items, 1):
            extra = (f", size {it.size}" if it.size else "") + (
                ", FINAL SALE" if it.final_sale else "")
            lines.append(f"  {k}. {it.name} ({it.category}{extra}) x{it.qty} @ ${it.price:.2f}")
        return "\n".join(lines)


@dataclass
class Scenario:
    """One generated inquiry and the policy's correct resolution."""

    customer: str
    today: dt.date
    orders: list[Order]
    category: str
    order: Order
    item: Item
    message: str
    resolution: tuple  # ("refund", oid, amount) | ("none",) | ("deny", oid) | ...
    facts: dict = field(default_factory=dict)


def _money(x: float) -> float:
    return round(x + 1e-9, 2)


def _item(rng: random.Random, category: str | None = None) -> Item:
    category = category or rng.choice(list(CATALOG))
    name, lo, hi = rng.choice(CATALOG[category])
    price = _money(rng.randint(lo, hi) - 0.01)
    size = rng.choice(SIZES[category]) if category in SIZES else None
    qty = 1 if category in ("electronics", "shoes") else rng.choice([1, 1, 1, 2])
    return Item(name, category, price, qty, size, final_sale=rng.random() < 0.12)


def _order(rng: random.Random, today: dt.date, used: set, status: str, age: int,
           first: Item | None = None) -> Order:
    while True:
        oid = f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.randint(1000, 9999)}"
        if oid not in used:
            used.add(oid)
            break
    items = [first] if first else []
    for extra in [_item(rng) for _ in range(rng.randint(0 if first else 1, 2))]:
        if all(extra.name != it.name for it in items):
            items.append(extra)
    rng.shuffle(items)
    fee = rng.choice([0.0, 4.99, 5.99, 7.5, 9.99])
    if status == "delivered":
        delivered = today - dt.timedelta(days=age)
        placed = delivered - dt.timedelta(days=rng.randint(2, 7))
        return Order(oid, placed, status, items, fee, delivered=delivered)
    if status == "in_transit":
        eta = today - dt.timedelta(days=age)  # age > 0: past the estimate
        placed = min(today, eta) - dt.timedelta(days=rng.randint(3, 8))
        return Order(oid, placed, status, items, fee, eta=eta)
    return Order(oid, today - dt.timedelta(days=rng.randint(0, 2)), status, items, fee)


def generate(index: int) -> Scenario:
    """The facts and correct resolution of task ``index`` (over all splits)."""
    rng = random.Random(f"ecommerce_service:{index}")
    category = CATEGORIES[index % len(CATEGORIES)]
    eligible = rng.random() < 0.6
    today = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 700))
    used: set = set()
    facts: dict[str, Any] = {"eligible": eligible}
    status, cat = "delivered", None
    if category == "refund":
        cat = rng.choice(list(CATALOG))
        window = ELECTRONICS_REFUND_DAYS if cat == "electronics" else REFUND_DAYS
        age = rng.randint(1, window) if eligible else rng.randint(window + 1, window + 40)
    elif category == "exchange":
        cat = rng.choice(["apparel", "shoes"]) if eligible or rng.random() < 0.7 else "kitchen"
        age = rng.randint(1, EXCHANGE_DAYS) if eligible else rng.randint(1, EXCHANGE_DAYS + 30)
    elif category == "damaged":
        age = rng.randint(0, DAMAGE_DAYS) if eligible else rng.randint(DAMAGE_DAYS + 1, 60)
    elif category == "shipping":
        status = "in_transit"
        age = -rng.randint(0, 5) if eligible else rng.randint(LATE_GRACE_DAYS + 1, 20)
        if eligible and rng.random() < 0.5:
            age = rng.randint(0, LATE_GRACE_DAYS)  # late, but within the grace period
    elif category == "warranty":
        cat = "electronics" if eligible or rng.random() < 0.5 else rng.choice(["home", "kitchen"])
        age = (rng.randint(ELECTRONICS_REFUND_DAYS + 1, WARRANTY_DAYS) if eligible
               else rng.randint(ELECTRONICS_REFUND_DAYS + 1, WARRANTY_DAYS + 300))
    else:
        status = "processing" if eligible else rng.choice(["in_transit", "in_transit"])
        age = -rng.randint(1, 6)
    item = _item(rng, cat)
    if category in ("refund", "exchange") and eligible:
        item.final_sale = False
    if category == "exchange" and eligible and rng.random() < 0.25:
        eligible = False
        facts["worn"] = True
    elif category == "exchange" and not eligible and rng.random() < 0.3:
        item.final_sale = True
    order = _order(rng, today, used, status, age, first=item)
    others = [_order(rng, today, used, "delivered", rng.randint(5, 300))
              for _ in range(rng.randint(1, 3))]
    orders = sorted(others + [order], key=lambda o: o.placed, reverse=True)
    oid, amount = order.order_id, _money(item.price * item.qty)
    # Apply the policy.
    if category == "refund":
        window = ELECTRONICS_REFUND_DAYS if item.category == "electronics" else REFUND_DAYS
        ok = age <= window and not item.final_sale
        resolution = ("refund", oid, amount) if ok else ("deny", oid)
    elif category == "exchange":
        ok = (item.category in SIZES and age <= EXCHANGE_DAYS and not item.final_sale
              and not facts.get("worn"))
        sizes = SIZES.get(item.category, ["M"])
        new_size = rng.choice([s for s in sizes if s != item.size] or sizes)
        facts["new_size"] = new_size
        resolution = ("exchange", oid, item.name, new_size) if ok else ("deny", oid)
    elif category == "damaged":
        facts["wants"] = rng.choice(["refund", "replacement"])
        if age > DAMAGE_DAYS:
            resolution = ("deny", oid)
        elif facts["wants"] == "refund":
            resolution = ("refund", oid, amount)
        else:
            resolution = ("replace", oid, item.name)
    elif category == "shipping":
        resolution = ("reship", oid) if age > LATE_GRACE_DAYS else ("none",)
    elif category == "warranty":
        ok = item.category == "electronics" and age <= WARRANTY_DAYS
        resolution = ("warranty_claim", oid, item.name) if ok else ("deny", oid)
    else:
        resolution = ("cancel", oid) if order.status == "processing" else ("deny", oid)
    facts.update(age=age, mentions_id=rng.random() < 0.6)
    customer = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    return Scenario(customer, today, orders, category, order, item, "", resolution, facts)


_MESSAGES = {
    "refund": ["I'd like to return the {item} from {ref} and get my money back.",
               "Can I get a refund for the {item} ({ref})? I don't need it anymore.",
               "The {item} from {ref} isn't what I expected. Please refund it."],
    "exchange": ["The {item} from {ref} doesn't fit. Can I swap it for size {size}?{worn}",
                 "I need a different size of the {item} ({ref}), size {size} please.{worn}"],
    "damaged": ["The {item} in {ref} arrived broken. I'd like a {wants}.",
                "My {item} ({ref}) came damaged in the box. Please send a {wants}."],
    "shipping": ["Where is my package? {ref} still hasn't arrived.",
                 "My order {ref} was supposed to arrive by now. What's going on?"],
    "warranty": ["My {item} from {ref} stopped working. Is it covered?",
                 "The {item} ({ref}) has a defect now, it won't turn on / work properly."],
    "cancellation": ["Please cancel {ref}, I ordered by mistake.",
                     "I changed my mind about {ref}. Can you cancel it?"],
}
_OPENERS = ["Hi, this is {name}.", "Hello! {name} here.", "Good morning, my name is {name}.",
            "{name} writing."]
_CHATTER = ["", " Also, love your store!", " I've been a customer for years.",
            " I'm travelling next week, so a quick answer would be great."]


def render_message(sc: Scenario, seed: int | None) -> str:
    """The customer's wording for ``sc``; the seed picks among paraphrases."""
    rng = random.Random(f"ecommerce_service:msg:{seed}:{sc.order.order_id}")
    wants = sc.facts.get("wants", "refund")
    ref = (f"order {sc.order.order_id}" if sc.facts["mentions_id"]
           else ("my order" if sc.category in ("shipping", "cancellation")
                 else f"my order of {sc.order.placed:%B} {sc.order.placed.day}"))
    if sc.category in ("shipping", "cancellation") and not sc.facts["mentions_id"]:
        ref = f"the order I placed on {sc.order.placed}"
    text = rng.choice(_MESSAGES[sc.category]).format(
        item=sc.item.name.lower(), ref=ref, size=sc.facts.get("new_size", ""),
        wants="refund" if wants == "refund" else "replacement",
        worn=" I wore it once." if sc.facts.get("worn") else " It's unworn, tags on.",
    )
    return (f"{rng.choice(_OPENERS).format(name=sc.customer)} {text}"
            f"{rng.choice(_CHATTER)}")


_RESOLUTIONS = ("refund", "exchange", "replace", "reship", "warranty_claim", "cancel", "deny")


class ECommerceServiceEnv(CommandEnv):
    """Customer service under a policy book; see the module doc and the README."""

    instructions = INSTRUCTIONS
    snapshot_safe = True
    env_name = "ecommerce_service"

    def __init__(self, split: str = "train"):
        super().__init__(split)
        self.sc: Scenario | None = None

    def reset(self, task: int | str | None = None, seed: int | None = None) -> str:
        index = self._tasks.resolve(task, seed)
        self.sc = generate(index)
        self.sc.message = render_message(self.sc, seed)
        self.done = False
        self.classified: str | None = None
        self.resolutions: list[tuple] = []
        self.looked_up: set[str] = set()
        self.listed = False
        self.policies: set[str] = set()
        return (f"Today is {self.sc.today}. New message from customer {self.sc.customer}:\n"
                f"\"{self.sc.message}\"")

    def _find(self, oid: str):
        for o in self.sc.orders:
            if o.order_id.lower() == oid.strip().lstrip("#").lower():
                return o
        return None

    def command(self, name: str, arg: str) -> tuple[str, float, bool, dict[str, Any]]:
        args = [a.strip() for a in arg.split(",")] if arg else []
        if name == "classify":
            if arg.lower() not in CATEGORIES:
                return f"Unknown category {arg!r}; one of {', '.join(CATEGORIES)}.", 0.0, \
                    False, {"invalid": True}
            if self.classified is not None:
                return f"Already classified as {self.classified}.", 0.0, False, {}
            self.classified = arg.lower()
            return f"Inquiry classified as {self.classified}.", 0.0, False, {}
        if name == "list_orders":
            self.listed = True
            return "\n".join(
                f"{o.order_id} placed {o.placed}: " + ", ".join(i.name for i in o.items)
                for o in self.sc.orders), 0.0, False, {}
        if name == "lookup_order":
            order = self._find(arg)
            if order is None:
                return f"No order {arg!r} for this customer.", 0.0, False, {}
            self.looked_up.add(order.order_id)
            return order.describe(), 0.0, False, {}
        if name == "check_policy":
            topic = arg.lower()
            if topic not in POLICY:
                return f"No policy on {arg!r}; topics: {', '.join(POLICY)}.", 0.0, False, {}
            self.policies.add(topic)
            return POLICY[topic], 0.0, False, {}
        if name in _RESOLUTIONS:
            return self._resolve(name, args)
        if name == "reply":
            self.done = True
            reward, info = self._score(arg)
            return "Conversation closed.", reward, True, info
        return f"Unknown action {name!r}.", 0.0, False, {"invalid": True}

    def _resolve(self, name: str, args: list[str]) -> tuple[str, float, bool, dict[str, Any]]:
        order = self._find(args[0]) if args else None
        if order is None:
            return "The first argument must be one of the customer's order ids.", 0.0, False, {}
        act: tuple = (name, order.order_id)
        if name == "refund":
            try:
                act += (_money(float(args[1].replace("$", ""))),)
            except (IndexError, ValueError):
                return "Usage: refund[ORDER_ID, AMOUNT].", 0.0, False, {"invalid": True}
        elif name in ("replace", "warranty_claim", "exchange"):
            if len(args) < (3 if name == "exchange" else 2):
                return f"Missing arguments for {name}.", 0.0, False, {"invalid": True}
            act += tuple(a.lower() for a in args[1:3])
        self.resolutions.append(act)
        if name == "refund":
            return f"Refunded ${act[2]:.2f} on order {act[1]}.", 0.0, False, {}
        if name == "deny":
            return f"Request on order {act[1]} declined.", 0.0, False, {}
        return f"{name} recorded for order {act[1]}.", 0.0, False, {}

    def _matches(self, act: tuple) -> bool:
        want = self.sc.resolution
        if act[0] != want[0] or act[1] != want[1]:
            return False
        if want[0] == "refund":
            return abs(act[2] - want[2]) < 0.011
        if want[0] in ("replace", "warranty_claim"):
            return act[2] == want[2].lower()
        if want[0] == "exchange":
            return act[2:] == (want[2].lower(), want[3].lower())
        return True

    def _score(self, reply: str) -> tuple[float, dict[str, Any]]:
        """0.2 category + 0.6 resolution + 0.2 reply naming the order; -0.3 per wrong action."""
        sc = self.sc
        cls_ok = self.classified == sc.category
        if sc.resolution[0] == "none":
            res_ok = not self.resolutions
            wrong = len(self.resolutions)
        else:
            hits = [a for a in self.resolutions if self._matches(a)]
            res_ok = bool(hits)
            wrong = len(self.resolutions) - min(len(hits), 1)
        reply_ok = sc.order.order_id.lower() in reply.lower()
        reward = W_CLASSIFY * cls_ok + W_RESOLVE * res_ok + W_REPLY * reply_ok - PENALTY * wrong
        reward = max(-1.0, min(1.0, reward))
        return reward, {"classified": cls_ok, "resolved": res_ok, "replied": reply_ok,
                        "wrong_actions": wrong, "solved": cls_ok and res_ok and reply_ok
                        and wrong == 0, "expected": sc.resolution}

    def valid_actions(self) -> list[str]:
        if self.done or self.sc is None:
            return []
        ids = [o.order_id for o in self.sc.orders]
        acts = [] if self.classified else [f"classify[{c}]" for c in CATEGORIES]
        acts += ["list_orders"] + [f"lookup_order[{i}]" for i in ids]
        acts += [f"check_policy[{t}]" for t in POLICY]
        acts += [f"{a}[{i}]" for a in ("deny", "cancel", "reship") for i in ids]
        acts += [f"reply[We have looked into order {i}.]" for i in ids]
        return acts

    def oracle_action(self) -> str | None:
        """Classify, find the order, read the policy, resolve, reply."""
        if self.done or self.sc is None:
            return None
        sc = self.sc
        if self.classified is None:
            return f"classify[{sc.category}]"
        if not sc.facts["mentions_id"] and not self.listed:
            return "list_orders"
        if sc.order.order_id not in self.looked_up:
            return f"lookup_order[{sc.order.order_id}]"
        if sc.category not in self.policies:
            return f"check_policy[{sc.category}]"
        want = sc.resolution
        if want[0] != "none" and not any(self._matches(a) for a in self.resolutions):
            if want[0] == "refund":
                return f"refund[{want[1]}, {want[2]:.2f}]"
            return f"{want[0]}[{', '.join(str(x) for x in want[1:])}]"
        outcome = {"none": "is on its way", "deny": "is not eligible under our policy"}.get(
            want[0], f"has been handled ({want[0]})")
        return (f"reply[Thank you for reaching out. Your request about order "
                f"{sc.order.order_id} {outcome}.]")
