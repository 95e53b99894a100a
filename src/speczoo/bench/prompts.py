"""The built-in A/B prompts of `speczoo demo` and `speczoo bench --builtin`: one per kind of work.

Each prompt is one user message rendered through the target's chat template. The texts were written
for this project. Nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass

_STORY = """The harbour town of Vell woke before the sun. Fishermen carried nets down the stone steps,
bakers lit their ovens, and the old clock above the market struck five with a cracked, patient voice.
Mara Quill kept the lighthouse at the end of the northern pier. Every evening she climbed one hundred
and twelve steps, trimmed the wick, polished the great lens, and wrote the weather in a green ledger
that had belonged to her grandmother. The ledger recorded storms that nobody else remembered: the gale
of the wet spring, the fog that lasted nine days, the winter the bay froze so hard that children walked
to the island and back. On the morning this story begins, Mara found a second ledger under the first,
bound in grey cloth, its pages filled with a hand she did not recognise and a map of a coast that did
not appear on any chart in the harbour office."""

_CODE = '''def summarize_orders(orders, tax_rate=0.2, currency="EUR"):
    """Return per-customer totals, the grand total and the largest order."""
    totals = {}
    largest = None
    grand_total = 0.0
    for order in orders:
        customer = order["customer"]
        items = order.get("items", [])
        subtotal = 0.0
        for item in items:
            price = float(item["price"])
            quantity = int(item.get("quantity", 1))
            if quantity < 0:
                raise ValueError(f"negative quantity in order {order['id']}")
            subtotal += price * quantity
        discount = order.get("discount", 0.0)
        if discount:
            subtotal = subtotal * (1.0 - discount)
        tax = subtotal * tax_rate
        total = round(subtotal + tax, 2)
        totals[customer] = totals.get(customer, 0.0) + total
        grand_total += total
        if largest is None or total > largest["total"]:
            largest = {"id": order["id"], "customer": customer, "total": total}
    report = {
        "currency": currency,
        "customers": {name: round(value, 2) for name, value in sorted(totals.items())},
        "grand_total": round(grand_total, 2),
        "largest": largest,
    }
    if not orders:
        report["note"] = "no orders"
    return report


def format_report(report):
    lines = [f"Totals in {report['currency']}:"]
    for name, value in report["customers"].items():
        lines.append(f"  {name:<20} {value:>10.2f}")
    lines.append(f"  {'TOTAL':<20} {report['grand_total']:>10.2f}")
    largest = report.get("largest")
    if largest:
        lines.append(f"Largest order: {largest['id']} by {largest['customer']} ({largest['total']:.2f})")
    return "\\n".join(lines)
'''

_DOC = """Cedar Valley Community Library — Visitor Information

Opening hours. The main building is open Monday to Friday from 9:00 to 20:00 and on Saturday from
10:00 to 16:00. It is closed on Sundays and on public holidays. The children's wing opens one hour
later than the main building on weekdays.

Borrowing. Members may borrow up to twelve items at a time. Books are lent for three weeks and may be
renewed twice, online or at the desk, unless another member has reserved them. Films and games are
lent for one week and cannot be renewed. Late returns cost 20 cents per item per day, up to a maximum
of 5 euros per item.

Membership. Membership is free for residents of Cedar Valley and costs 15 euros a year for everyone
else. To join, bring a photo identity document and a proof of address dated within the last three
months. Children under 14 need a parent or guardian to sign the form.

Rooms. The two study rooms on the first floor can be booked for up to three hours a day. Bookings open
seven days in advance. The large meeting room holds 40 people and is available to local associations
free of charge on weekday evenings.

Accessibility. There is step-free access through the east entrance on Mill Street. A hearing loop is
installed at the main desk, and large-print and audio books are kept on the ground floor."""


def _unwrap(text: str) -> str:
    """Join the hard-wrapped lines of each paragraph (the wraps above are only for this file's width)."""
    return "\n\n".join(" ".join(p.split("\n")) for p in text.split("\n\n"))


@dataclass(frozen=True)
class BuiltinPrompt:
    name: str
    kind: str
    message: str


BUILTIN_PROMPTS: list[BuiltinPrompt] = [
    BuiltinPrompt("verbatim", "verbatim reproduction",
                  "Repeat the following text exactly as it is written, with no changes and no comments:\n\n"
                  + _unwrap(_STORY)),
    BuiltinPrompt("code_edit", "code edit",
                  "Rename the variable `subtotal` to `net_amount` everywhere in this code and return the "
                  "whole updated code in one Python block, with no explanation.\n\n```python\n" + _CODE
                  + "```"),
    BuiltinPrompt("extractive_qa", "extractive QA over a document",
                  "Answer using only the document below. For each question, write the question on its "
                  "own line, then quote in full the exact sentences of the document that answer it.\n"
                  "Questions: When is the main building open on Saturday? How long are books "
                  "lent for, and how many times can they be renewed? What does membership cost for "
                  "people who do not live in Cedar Valley? How many people does the large meeting room "
                  "hold?\n\nDocument:\n" + _unwrap(_DOC)),
    BuiltinPrompt("free_form", "free-form writing",
                  "Write a short, original story (about 300 words) about a beekeeper in the mountains "
                  "who discovers that her bees have started building honeycomb in the shape of letters."),
]


def builtin_prompt(name: str) -> BuiltinPrompt:
    for p in BUILTIN_PROMPTS:
        if p.name == name:
            return p
    raise ValueError(f"unknown built-in prompt {name!r}; choose one of {[p.name for p in BUILTIN_PROMPTS]}")
