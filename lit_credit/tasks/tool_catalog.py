"""The synthetic tool world of the ``toolcall`` task: schemas, value vocabularies, deterministic handlers,
the one-line facts a gold summary states, and the question templates of the four subsets.

Everything here is data or a pure function. Schemas are compact on purpose: the embedded policy has a
~512-token vocabulary and reads the allowed tools' schemas in every prompt. A handler maps validated
arguments and a 48-bit hash of the call to a result dict (or an error string); the hash is taken over the
canonical arguments (strings trimmed and casefolded, numbers as floats), so "Seoul" and " seoul" get the
same weather. Bump :data:`CATALOG_VERSION` when anything here changes what a prompt or a response says.
"""
from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CATALOG_VERSION = 2
SUBSETS = ("single", "parallel", "multi", "irrelevant", "chain")


# How a prompt tells the policy to call tools; the embedded chat template ends its tool list with it.
TOOLS_INSTRUCTION = 'Call tools inside <tool_call></tool_call> as JSON {"name": ..., "arguments": ...}.'


def tool_signature(schema: dict) -> str:
    """One tool as the embedded chat template lists it (:func:`~lit_credit.models.tokenizer.chat_template`):
    ``name(arg: type, ...) - description``."""
    fn = schema.get("function", schema)
    props = (fn.get("parameters") or {}).get("properties") or {}
    args = ", ".join(f"{k}: {v.get('type')}" for k, v in props.items())
    description = fn.get("description")
    return f"{fn['name']}({args})" + (f" - {description}" if description else "")


@dataclass(frozen=True)
class SignatureToolPrompt:
    """The project's tool prompt (a :class:`~lit_credit.interfaces.ToolPrompt`, every task's
    :attr:`~lit_credit.tasks.Task.tool_prompt`): one :func:`tool_signature` line per tool between ``<tools>`` tags,
    then ``instruction``. The embedded chat template writes exactly this as its system message; the chat codec
    writes it for a template that ignores ``tools`` (SmolLM2's ChatML)."""

    instruction: str = TOOLS_INSTRUCTION

    def text(self, tools: Sequence[dict[str, Any]]) -> str:
        return "<tools>\n" + "".join(tool_signature(t) + "\n" for t in tools) + "</tools>\n" + self.instruction


TOOL_PROMPT = SignatureToolPrompt()


def dumps(obj: Any) -> str:
    """Compact JSON (no blanks after separators), the one serialisation of calls and responses."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    props = {k: {"type": t} for k, t in params.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": list(params)}}}


SCHEMAS: dict[str, dict[str, Any]] = {s["function"]["name"]: s for s in [
    _tool("get_weather", "Weather in a city on a date (YYYY-MM-DD).", city="string", date="string"),
    _tool("get_time", "Local time in a city.", city="string"),
    _tool("convert_currency", "Convert an amount between currency codes.", amount="number", **{
        "from": "string", "to": "string"}),
    _tool("get_exchange_rate", "Exchange rate from base to quote currency.", base="string", quote="string"),
    _tool("get_stock_price", "Stock price in USD.", symbol="string"),
    _tool("translate_text", "Translate text into a language.", text="string", language="string"),
    _tool("web_search", "Search the web; returns the top result.", query="string"),
    _tool("get_calendar_events", "My calendar events on a date.", date="string"),
    _tool("create_event", "Add an event to my calendar.", title="string", date="string"),
    _tool("calculate", "Evaluate an arithmetic expression.", expression="string"),
    _tool("find_restaurant", "Find a restaurant in a city.", city="string", cuisine="string"),
    _tool("send_email", "Send an email.", to="string", subject="string"),
    _tool("get_news", "Latest headline on a topic.", topic="string"),
    _tool("get_flight_status", "Status of a flight.", flight="string"),
    _tool("get_distance", "Distance in km between two cities.", origin="string", destination="string"),
]}

# ------------------------------------------------------------------------------------------------ vocabularies
PER_USD = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 150.0, "KRW": 1350.0, "CNY": 7.2, "CAD": 1.36}
TRANSLATIONS = {
    "hello": {"French": "bonjour", "Spanish": "hola", "German": "hallo", "Italian": "ciao",
              "Korean": "annyeong", "Japanese": "konnichiwa"},
    "thank you": {"French": "merci", "Spanish": "gracias", "German": "danke", "Italian": "grazie",
                  "Korean": "gamsahamnida", "Japanese": "arigato"},
    "good night": {"French": "bonne nuit", "Spanish": "buenas noches", "German": "gute Nacht",
                   "Italian": "buona notte", "Korean": "jal ja", "Japanese": "oyasumi"},
    "water": {"French": "eau", "Spanish": "agua", "German": "Wasser", "Italian": "acqua", "Korean": "mul",
              "Japanese": "mizu"},
    "cat": {"French": "chat", "Spanish": "gato", "German": "Katze", "Italian": "gatto", "Korean": "goyangi",
            "Japanese": "neko"},
    "friend": {"French": "ami", "Spanish": "amigo", "German": "Freund", "Italian": "amico", "Korean": "chingu",
               "Japanese": "tomodachi"},
}
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Egypt": "Cairo",
            "Peru": "Lima", "Norway": "Oslo", "Canada": "Ottawa", "Germany": "Berlin", "Kenya": "Nairobi",
            "Chile": "Santiago", "Greece": "Athens"}
VOCAB: dict[str, tuple[Any, ...]] = {
    "city": ("Seoul", "Tokyo", "Paris", "London", "Berlin", "Madrid", "Rome", "Cairo", "Lima", "Oslo",
             "Sydney", "Toronto", "Busan", "Dubai"),
    "date": ("2026-11-02", "2026-11-05", "2026-11-09", "2026-11-13", "2026-11-17", "2026-11-20",
             "2026-11-24", "2026-11-30", "2026-12-03", "2026-12-08", "2026-12-15", "2026-12-21"),
    "currency": tuple(PER_USD),
    "foreign": tuple(c for c in PER_USD if c != "USD"),
    "amount": (10, 25, 40, 50, 75, 100, 120, 200, 250, 500, 800, 1000),
    "symbol": ("AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "GOOG", "META", "IBM"),
    "phrase": tuple(TRANSLATIONS),
    "language": ("French", "Spanish", "German", "Italian", "Korean", "Japanese"),
    "query": ("hiking trails", "pasta recipes", "cheap flights", "python tips", "museum hours", "bike repair",
              "chess openings", "yoga basics"),
    "title": ("Team sync", "Dentist", "Yoga class", "Book club", "Project review", "Gym", "Piano lesson"),
    "number": (3, 7, 12, 15, 24, 36, 48, 59, 64, 81, 96, 125),
    "op": ("+", "-", "*"),
    "cuisine": ("sushi", "pizza", "tacos", "ramen", "curry", "bbq"),
    "person": ("ana@mail.com", "ben@mail.com", "chloe@mail.com", "dan@mail.com", "eva@mail.com",
               "finn@mail.com"),
    "subject": ("Meeting notes", "Lunch plans", "Trip ideas", "Weekly report", "Party invite"),
    "topic": ("sports", "science", "economy", "music", "travel", "health", "space"),
    "flight": ("KE901", "AF267", "BA18", "LH712", "DL55", "UA890", "OZ204", "JL43"),
    "country": tuple(CAPITALS),
    "word": ("apple", "river", "mountain", "cat", "garden", "window", "elephant", "book", "sun", "pencil",
             "orange", "tiger", "planet", "bridge", "music", "coffee", "island", "rocket", "candle", "forest"),
    "name": ("Ana", "Ben", "Chloe", "Dan", "Eva", "Finn", "Gia", "Hugo"),
}
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy")
RESTAURANTS = ("Golden Fork", "Blue Door", "Red Lantern", "Olive Tree", "Silver Spoon", "Green Leaf",
               "Little Oven", "Harbor House")
EVENTS = ("Standup", "Lunch with Ana", "Design review", "Call with Ben", "Gym", "Dinner")
HEADLINES = ("{T} funding rises in {c}", "New {t} record set in {c}", "{c} hosts a {t} summit",
             "Big {t} news from {c}")
FLIGHT_STATES = ("on time", "delayed", "boarding", "landed")

# ------------------------------------------------------------------------------------------------ hashing
def _canon(x: Any) -> Any:
    if isinstance(x, str):
        return x.strip().casefold()
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, Mapping):
        return {str(k): _canon(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    return str(x)


def call_hash(name: str, arguments: Mapping[str, Any]) -> int:
    """A 48-bit hash of a call over its canonical arguments (stable across processes and platforms)."""
    key = json.dumps([name, _canon(arguments)], sort_keys=True, ensure_ascii=False, default=str)
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)


def _display(value: str, vocab: str) -> str:
    """The vocabulary's spelling of ``value`` when it is one (case-insensitive), else ``value`` trimmed."""
    low = value.strip().casefold()
    return next((v for v in VOCAB[vocab] if isinstance(v, str) and v.casefold() == low), value.strip())


# ------------------------------------------------------------------------------------------------ handlers
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_FLIGHT = re.compile(r"^[A-Z0-9]{2}\d{1,4}$")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
Result = dict[str, Any] | str  # a result dict, or an error message


def _date(d: str) -> str | None:
    return d.strip() if _DATE.match(d.strip()) else None


def _currency(code: str) -> str | None:
    c = code.strip().upper()
    return c if c in PER_USD else None


def _weather(a: Mapping, h: int) -> Result:
    if (date := _date(a["date"])) is None:
        return "date must be YYYY-MM-DD"
    return {"city": _display(a["city"], "city"), "date": date, "temp_c": h % 36 - 5,
            "condition": CONDITIONS[(h >> 8) % len(CONDITIONS)]}


def _time(a: Mapping, h: int) -> Result:
    return {"city": _display(a["city"], "city"), "time": f"{h % 24:02d}:{(h >> 8) % 60:02d}"}


def _rate(base: str, quote: str) -> float:
    return PER_USD[quote] / PER_USD[base]


def _convert(a: Mapping, h: int) -> Result:
    src, dst = _currency(a["from"]), _currency(a["to"])
    if src is None or dst is None:
        return f"unknown currency code: {a['from'] if src is None else a['to']}"
    return {"amount": a["amount"], "from": src, "to": dst, "result": round(a["amount"] * _rate(src, dst), 2)}


def _exchange(a: Mapping, h: int) -> Result:
    base, quote = _currency(a["base"]), _currency(a["quote"])
    if base is None or quote is None:
        return f"unknown currency code: {a['base'] if base is None else a['quote']}"
    return {"base": base, "quote": quote, "rate": round(_rate(base, quote), 4)}


def _stock(a: Mapping, h: int) -> Result:
    return {"symbol": a["symbol"].strip().upper(), "price": (5000 + h % 45000) / 100}


def _translate(a: Mapping, h: int) -> Result:
    lang = _display(a["language"], "language")
    if lang not in VOCAB["language"]:
        return f"unsupported language: {a['language']}"
    text = a["text"].strip()
    return {"language": lang, "translation": TRANSLATIONS.get(text.casefold(), {}).get(lang, f"[{lang}] {text}")}


def _search(a: Mapping, h: int) -> Result:
    q = a["query"].strip()
    return {"query": q, "top_result": f"{q.capitalize()} guide no. {h % 9 + 1}"}


def _calendar(a: Mapping, h: int) -> Result:
    if (date := _date(a["date"])) is None:
        return "date must be YYYY-MM-DD"
    n = h % 3
    return {"date": date, "events": [EVENTS[(h >> (4 * i + 4)) % len(EVENTS)] for i in range(n)]}


def _create(a: Mapping, h: int) -> Result:
    if (date := _date(a["date"])) is None:
        return "date must be YYYY-MM-DD"
    return {"status": "created", "title": a["title"].strip(), "date": date, "event_id": f"E{h % 9000 + 1000}"}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("unsupported expression")


def _calculate(a: Mapping, h: int) -> Result:
    expr = a["expression"].strip()
    if len(expr) > 60:
        return "expression too long"
    try:
        value = _eval(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return "invalid expression: use numbers and + - * / ( )"
    value = round(value, 4)
    return {"expression": expr, "result": int(value) if float(value).is_integer() else value}


def _restaurant(a: Mapping, h: int) -> Result:
    return {"name": RESTAURANTS[h % len(RESTAURANTS)], "city": _display(a["city"], "city"),
            "cuisine": a["cuisine"].strip(), "rating": 3.0 + (h >> 8) % 21 / 10}


def _email(a: Mapping, h: int) -> Result:
    if "@" not in a["to"]:
        return "invalid email address"
    return {"status": "sent", "to": a["to"].strip(), "message_id": f"M{h % 9000 + 1000}"}


def _news(a: Mapping, h: int) -> Result:
    topic = a["topic"].strip()
    city = VOCAB["city"][(h >> 8) % len(VOCAB["city"])]
    return {"topic": topic, "headline": HEADLINES[h % len(HEADLINES)].format(T=topic.capitalize(), t=topic, c=city)}


def _flight(a: Mapping, h: int) -> Result:
    flight = a["flight"].strip().upper()
    if not _FLIGHT.match(flight):
        return "unknown flight number"
    return {"flight": flight, "status": FLIGHT_STATES[h % len(FLIGHT_STATES)],
            "gate": f"{'ABCD'[(h >> 4) % 4]}{(h >> 8) % 30 + 1}"}


def _distance(a: Mapping, h: int) -> Result:
    o, d = _display(a["origin"], "city"), _display(a["destination"], "city")
    pair = sorted([o.casefold(), d.casefold()])  # symmetric: A to B is as far as B to A
    km = 0 if pair[0] == pair[1] else 100 + call_hash("get_distance", {"pair": pair}) % 9900
    return {"origin": o, "destination": d, "km": km}


HANDLERS: dict[str, Callable[[Mapping[str, Any], int], Result]] = {
    "get_weather": _weather, "get_time": _time, "convert_currency": _convert, "get_exchange_rate": _exchange,
    "get_stock_price": _stock, "translate_text": _translate, "web_search": _search,
    "get_calendar_events": _calendar, "create_event": _create, "calculate": _calculate,
    "find_restaurant": _restaurant, "send_email": _email, "get_news": _news, "get_flight_status": _flight,
    "get_distance": _distance,
}

# ------------------------------------------------------------------------------------------------ summaries
def _fmt(x: Any) -> str:
    return dumps(x) if isinstance(x, (dict, list)) else str(x)


_FACTS: dict[str, Callable[[Mapping, Mapping], str]] = {
    "get_weather": lambda a, r: f"The weather in {r['city']} on {r['date']} is {r['temp_c']}C and {r['condition']}.",
    "get_time": lambda a, r: f"The local time in {r['city']} is {r['time']}.",
    "convert_currency": lambda a, r: f"{r['amount']} {r['from']} converts to {r['result']} {r['to']}.",
    "get_exchange_rate": lambda a, r: f"The exchange rate from {r['base']} to {r['quote']} is {r['rate']}.",
    "get_stock_price": lambda a, r: f"The stock price of {r['symbol']} is {r['price']} USD.",
    "translate_text": lambda a, r: f"\"{a['text']}\" in {r['language']} is \"{r['translation']}\".",
    "web_search": lambda a, r: f"The top web search result for {r['query']} is \"{r['top_result']}\".",
    "get_calendar_events": lambda a, r: (f"Your calendar on {r['date']}: {', '.join(r['events'])}." if r["events"]
                                         else f"Your calendar has no events on {r['date']}."),
    "create_event": lambda a, r: (f"The event \"{r['title']}\" was created on your calendar for {r['date']} "
                                  f"(id {r['event_id']})."),
    "calculate": lambda a, r: f"Calculated: {r['expression']} = {r['result']}.",
    "find_restaurant": lambda a, r: (f"{r['name']} is a {r['cuisine']} restaurant in {r['city']}, "
                                     f"rated {r['rating']}."),
    "send_email": lambda a, r: f"The email to {r['to']} was sent (id {r['message_id']}).",
    "get_news": lambda a, r: f"The latest news about {r['topic']}: {r['headline']}.",
    "get_flight_status": lambda a, r: f"Flight {r['flight']} is {r['status']} at gate {r['gate']}.",
    "get_distance": lambda a, r: f"{r['origin']} to {r['destination']} is {r['km']} km.",
}


def fact(name: str, arguments: Mapping[str, Any], response: str) -> str:
    """The sentence a good summary says about one call and its JSON ``response`` (any tool, any response)."""
    try:
        result = json.loads(response)
    except ValueError:
        return f"{name} said: {response}"
    if isinstance(result, dict) and "error" in result:
        return f"{name} failed: {result['error']}."
    try:
        return _FACTS[name](arguments, result)
    except (KeyError, TypeError, IndexError):
        pass
    if isinstance(result, dict):
        return f"{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in result.items()) + "."
    return f"{name}: {_fmt(result)}."


# ------------------------------------------------------------------------------------------------ templates
Call = dict[str, Any]
Respond = Callable[[Call], dict[str, Any]]  # the simulator's parsed response to a call


def call(name: str, **arguments: Any) -> Call:
    return {"name": name, "arguments": arguments}


@dataclass(frozen=True)
class Template:
    """A question pattern. ``slots`` name the vocabulary of each placeholder (slots that share a
    vocabulary take distinct values). ``gold(v, respond)`` gives the gold steps x calls; a later step may
    use ``respond`` (the programmatic simulator) to read an earlier step's result. ``answer(v)`` is the
    direct reply of an irrelevant question."""

    id: str
    subset: str
    text: str
    slots: tuple[tuple[str, str], ...]
    gold: Callable[[dict[str, Any], Respond], list[list[Call]]] | None = None
    answer: Callable[[dict[str, Any]], str] | None = None

    def valid(self, values: tuple[Any, ...]) -> bool:
        seen: dict[str, set] = {}
        for (_, vocab), v in zip(self.slots, values):
            if v in seen.setdefault(vocab, set()):
                return False
            seen[vocab].add(v)
        return True

    def question(self, v: Mapping[str, Any]) -> str:
        return self.text.format(**v)


def _t(id: str, subset: str, text: str, slots: str, gold=None, answer=None) -> Template:
    """``slots`` as "name:vocab name:vocab" (a bare name is its own vocabulary)."""
    parts = [s.partition(":") for s in slots.split()]
    return Template(id, subset, text, tuple((name, vocab or name) for name, _, vocab in parts), gold, answer)


def _single(c: Callable[[dict], Call]):
    return lambda v, r: [[c(v)]]


def _expr(v: Mapping) -> str:
    return f"{v['a']} {v['op']} {v['b']}"


def _W(v: Mapping[str, Any], city: str = "city") -> Call:
    return call("get_weather", city=v[city], date=v["date"])


TEMPLATES: tuple[Template, ...] = (
    # single: one call
    _t("weather", "single", "What's the weather in {city} on {date}?", "city date", _single(_W)),
    _t("weather_rain", "single", "Will it rain in {city} on {date}?", "city date", _single(_W)),
    _t("time", "single", "What time is it in {city}?", "city", _single(lambda v: call("get_time", city=v["city"]))),
    _t("convert", "single", "Convert {amount} {src} to {dst}.", "amount src:currency dst:currency",
       _single(lambda v: call("convert_currency", amount=v["amount"], **{"from": v["src"], "to": v["dst"]}))),
    _t("convert_q", "single", "How much is {amount} {src} in {dst}?", "amount src:currency dst:currency",
       _single(lambda v: call("convert_currency", amount=v["amount"], **{"from": v["src"], "to": v["dst"]}))),
    _t("rate", "single", "What is the exchange rate from {src} to {dst}?", "src:currency dst:currency",
       _single(lambda v: call("get_exchange_rate", base=v["src"], quote=v["dst"]))),
    _t("stock", "single", "What is the stock price of {symbol}?", "symbol",
       _single(lambda v: call("get_stock_price", symbol=v["symbol"]))),
    _t("translate", "single", "Translate \"{phrase}\" into {language}.", "phrase language",
       _single(lambda v: call("translate_text", text=v["phrase"], language=v["language"]))),
    _t("search", "single", "Search the web for {query}.", "query",
       _single(lambda v: call("web_search", query=v["query"]))),
    _t("calendar", "single", "What is on my calendar on {date}?", "date",
       _single(lambda v: call("get_calendar_events", date=v["date"]))),
    _t("create", "single", "Add \"{title}\" to my calendar on {date}.", "title date",
       _single(lambda v: call("create_event", title=v["title"], date=v["date"]))),
    _t("calculate", "single", "Calculate {a} {op} {b}.", "a:number op b:number",
       _single(lambda v: call("calculate", expression=_expr(v)))),
    _t("restaurant", "single", "Find a {cuisine} restaurant in {city}.", "cuisine city",
       _single(lambda v: call("find_restaurant", city=v["city"], cuisine=v["cuisine"]))),
    _t("email", "single", "Email {person} with the subject \"{subject}\".", "person subject",
       _single(lambda v: call("send_email", to=v["person"], subject=v["subject"]))),
    _t("news", "single", "Any news about {topic}?", "topic", _single(lambda v: call("get_news", topic=v["topic"]))),
    _t("flight", "single", "Is flight {flight} on time?", "flight",
       _single(lambda v: call("get_flight_status", flight=v["flight"]))),
    _t("distance", "single", "How far is {city} from {city2}?", "city city2:city",
       _single(lambda v: call("get_distance", origin=v["city"], destination=v["city2"]))),
    # parallel: one step, two calls in one block
    _t("weather2", "parallel", "What's the weather in {city} and {city2} on {date}?", "city city2:city date",
       lambda v, r: [[_W(v), _W(v, "city2")]]),
    _t("stock2", "parallel", "Compare the stock prices of {symbol} and {symbol2}.", "symbol symbol2:symbol",
       lambda v, r: [[call("get_stock_price", symbol=v["symbol"]), call("get_stock_price", symbol=v["symbol2"])]]),
    _t("time2", "parallel", "What time is it in {city} and in {city2}?", "city city2:city",
       lambda v, r: [[call("get_time", city=v["city"]), call("get_time", city=v["city2"])]]),
    _t("weather_time", "parallel", "What's the weather in {city} on {date}, and the local time there?",
       "city date", lambda v, r: [[_W(v), call("get_time", city=v["city"])]]),
    _t("translate2", "parallel", "Translate \"{phrase}\" into {language} and {language2}.",
       "phrase language language2:language",
       lambda v, r: [[call("translate_text", text=v["phrase"], language=v["language"]),
                      call("translate_text", text=v["phrase"], language=v["language2"])]]),
    _t("rate2", "parallel", "Give me the {src} to {dst} and {src} to {dst2} exchange rates.",
       "src:currency dst:currency dst2:currency",
       lambda v, r: [[call("get_exchange_rate", base=v["src"], quote=v["dst"]),
                      call("get_exchange_rate", base=v["src"], quote=v["dst2"])]]),
    # multi: two sequential steps (some read the first result)
    _t("stock_convert", "multi", "Get the {symbol} stock price, then convert it from USD to {dst}.",
       "symbol dst:foreign",
       lambda v, r: [[s := call("get_stock_price", symbol=v["symbol"])],
                     [call("convert_currency", amount=r(s)["price"], **{"from": "USD", "to": v["dst"]})]]),
    _t("restaurant_event", "multi",
       "Find a {cuisine} restaurant in {city} and put dinner there on my calendar for {date}.",
       "cuisine city date",
       lambda v, r: [[s := call("find_restaurant", city=v["city"], cuisine=v["cuisine"])],
                     [call("create_event", title=f"Dinner at {r(s)['name']}", date=v["date"])]]),
    _t("calendar_create", "multi", "Check my calendar on {date}, then add \"{title}\" that day.", "date title",
       lambda v, r: [[call("get_calendar_events", date=v["date"])],
                     [call("create_event", title=v["title"], date=v["date"])]]),
    _t("weather_email", "multi", "Check the weather in {city} on {date} and email it to {person}.",
       "city date person",
       lambda v, r: [[s := _W(v)],
                     [call("send_email", to=v["person"],
                           subject=f"{r(s)['city']}: {r(s)['temp_c']}C, {r(s)['condition']}")]]),
    _t("rate_convert", "multi", "Look up the {src} to {dst} rate, then convert {amount} {src} to {dst}.",
       "src:currency dst:currency amount",
       lambda v, r: [[call("get_exchange_rate", base=v["src"], quote=v["dst"])],
                     [call("convert_currency", amount=v["amount"], **{"from": v["src"], "to": v["dst"]})]]),
    _t("search_email", "multi", "Search the web for {query} and email the top result to {person}.",
       "query person",
       lambda v, r: [[s := call("web_search", query=v["query"])],
                     [call("send_email", to=v["person"], subject=r(s)["top_result"])]]),
    # chain: two or three sequential steps, each later call copies a value of the previous response
    _t("dinner_plan", "chain",
       "Find a {cuisine} restaurant in {city}, add it to my calendar on {date}, and email the event id to {person}.",
       "cuisine city date person",
       lambda v, r: [[s := call("find_restaurant", city=v["city"], cuisine=v["cuisine"])],
                     [e := call("create_event", title=r(s)["name"], date=v["date"])],
                     [call("send_email", to=v["person"], subject=r(e)["event_id"])]]),
    _t("search_share", "chain",
       "Search the web for {query}, translate the top result into {language}, and email it to {person}.",
       "query language person",
       lambda v, r: [[s := call("web_search", query=v["query"])],
                     [t := call("translate_text", text=r(s)["top_result"], language=v["language"])],
                     [call("send_email", to=v["person"], subject=r(t)["translation"])]]),
    _t("stock_report", "chain",
       "Get the {symbol} stock price, convert it from USD to {dst}, and email the result to {person}.",
       "symbol dst:foreign person",
       lambda v, r: [[s := call("get_stock_price", symbol=v["symbol"])],
                     [c := call("convert_currency", amount=r(s)["price"], **{"from": "USD", "to": v["dst"]})],
                     [call("send_email", to=v["person"], subject=str(r(c)["result"]))]]),
    _t("flight_gate", "chain", "Check flight {flight}, then add its gate to my calendar on {date}.",
       "flight date",
       lambda v, r: [[s := call("get_flight_status", flight=v["flight"])],
                     [call("create_event", title=r(s)["gate"], date=v["date"])]]),
    _t("news_translate", "chain", "Get the latest news about {topic} and translate the headline into {language}.",
       "topic language",
       lambda v, r: [[s := call("get_news", topic=v["topic"])],
                     [call("translate_text", text=r(s)["headline"], language=v["language"])]]),
    _t("rate_calculate", "chain", "Look up the {src} to {dst} rate, then calculate {amount} times that rate.",
       "src:currency dst:currency amount",
       lambda v, r: [[s := call("get_exchange_rate", base=v["src"], quote=v["dst"])],
                     [call("calculate", expression=f"{v['amount']} * {r(s)['rate']}")]]),
    # irrelevant: no call; the ideal reply answers directly
    _t("capital", "irrelevant", "What is the capital of {country}?", "country",
       answer=lambda v: f"The capital of {v['country']} is {CAPITALS[v['country']]}."),
    _t("reverse", "irrelevant", "Spell the word {word} backwards.", "word",
       answer=lambda v: f"{v['word']} backwards is {v['word'][::-1]}."),
    _t("letters", "irrelevant", "How many letters are in the word {word}?", "word",
       answer=lambda v: f"The word {v['word']} has {len(v['word'])} letters."),
    _t("greet", "irrelevant", "Write a one-line greeting for {name}, who lives in {city}.", "name city",
       answer=lambda v: f"Hi {v['name']}! I hope all is well in {v['city']}."),
    _t("longer", "irrelevant", "Which word is longer, {word} or {word2}?", "word word2:word",
       answer=lambda v: (f"{v['word']} and {v['word2']} have the same length." if len(v["word"]) == len(v["word2"])
                         else "{} is longer than {}.".format(*sorted((v["word"], v["word2"]), key=len, reverse=True)))),
)
TEMPLATES_BY_ID = {t.id: t for t in TEMPLATES}
