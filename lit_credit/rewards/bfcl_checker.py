"""BFCL's AST checker for Python functions, ported from ``bfcl-eval`` 2026.3.23
(``bfcl_eval/eval_checker/ast_eval/ast_checker.py``), plus the per-call and per-argument verdicts the tool rewards
read: :class:`~lit_credit.rewards.hierr.HierRReward` on a row with a ``possible_answer`` (``task=bfcl``,
:mod:`lit_credit.tasks.bfcl`).

Why a port: the wheel's checker module imports ``bfcl_eval.constants.model_config``, which imports every model
handler and with them the API clients (openai, anthropic, ...) and tree-sitter, none of which the project
installs. The checker itself needs none of them: ``model_config`` only serves ``convert_func_name`` (a dot in a
function name becomes ``_`` for OpenAI-style models; the policy here writes names as the schema spells them, as
BFCL's prompting handlers do, so the name is kept). Everything else is the wheel's logic for
``Language.PYTHON``, check for check and in the same order, with the same ``error_type`` strings:
``tests/tasks/test_bfcl.py`` runs this port and the wheel's own checker (imported there with ``model_config``
stubbed) on every possible answer of every single-turn category and on perturbed calls, and requires the same
verdict and error type.

Nothing here imports the rest of lit-credit. Data shapes, as in BFCL:
a function description is ``{"name", "description", "parameters": {"type": "dict", "properties", "required"}}``
with BFCL's types (``integer``, ``float``, ``string``, ``boolean``, ``array``, ``tuple``, ``dict``, ``any``);
a model output is ``[{name: {param: value}}, ...]``; a possible answer is ``[{name: {param: [acceptable values]}},
...]`` where ``""`` among the values means the parameter may be left out.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lit_credit.rewards.pairing import greedy_pair_means

PYTHON_TYPE_MAPPING: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
PYTHON_NESTED_TYPE_CHECK_LIST = ["array", "tuple"]


# ------------------------------------------------------------------------------------------------ helpers
def find_description(func_descriptions: Any, name: str) -> dict | None:
    if isinstance(func_descriptions, list):
        for func_description in func_descriptions:
            if func_description["name"] == name:
                return func_description
        return None
    return func_descriptions


def get_possible_answer_type(possible_answer: list) -> type | None:
    for answer in possible_answer:
        if answer != "":  # optional parameter
            return type(answer)
    return None


def type_checker(param: str, value: Any, possible_answer: list, expected_type_description: str,
                 expected_type_converted: type, nested_type_converted: type | None) -> dict:
    """The wheel's ``type_checker``: one level of nested checking; a value of the possible answers' type where
    the schema's differs is a *variable* (``is_variable``), compared as it is."""
    result = {"valid": True, "error": [], "is_variable": False, "error_type": "type_error:simple"}
    is_variable = False
    possible_answer_type = get_possible_answer_type(possible_answer)
    if possible_answer_type is not None and possible_answer_type != expected_type_converted:
        is_variable = True

    if type(value) is expected_type_converted:
        if nested_type_converted is None:
            result["is_variable"] = is_variable
            return result
        for possible_answer_item in possible_answer:
            flag = True
            if type(possible_answer_item) is list:
                for value_item in value:
                    checker_result = type_checker(param, value_item, possible_answer_item, str(nested_type_converted),
                                                  nested_type_converted, None)
                    if not checker_result["valid"]:
                        flag = False
                        break
            if flag:
                return {"valid": True, "error": [], "is_variable": is_variable}
        result["valid"] = False
        result["error"] = [f"Nested type checking failed for parameter {param!r}. Expected outer type "
                           f"{expected_type_description} with inner type {nested_type_converted}. Parameter value: "
                           f"{value!r}."]
        result["error_type"] = "type_error:nested"

    possible_answer_type = get_possible_answer_type(possible_answer)
    if possible_answer_type is not None and type(value) is possible_answer_type:
        result["is_variable"] = True
        return result

    result["valid"] = False
    result["error"].append(f"Incorrect type for parameter {param!r}. Expected type {expected_type_description}, got "
                           f"{type(value).__name__}. Parameter value: {value!r}.")
    result["error_type"] = "type_error:simple"
    return result


def standardize_string(input_string: str) -> str:
    """Lower case, without spaces and ``,./-_*^``, single quotes as double: ``April 1, 2024`` = ``april 1 2024``."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", input_string).lower().replace("'", '"')


def string_checker(param: str, model_output: str, possible_answer: list) -> dict:
    standardized = [standardize_string(a) for a in possible_answer if type(a) is str]
    if standardize_string(model_output) not in standardized:
        return {"valid": False, "error": [f"Invalid value for parameter {param!r}: {model_output!r}. Expected one of "
                                          f"{possible_answer}. Case insensitive."],
                "error_type": "value_error:string"}
    return {"valid": True, "error": []}


def list_checker(param: str, model_output: list, possible_answer: list) -> dict:
    output = [standardize_string(x) if type(x) is str else x for x in model_output]
    standardized = [[standardize_string(x) if type(x) is str else x for x in answer]
                    for answer in possible_answer]
    if output not in standardized:
        return {"valid": False, "error": [f"Invalid value for parameter {param!r}: {model_output!r}. Expected one of "
                                          f"{possible_answer}."],
                "error_type": "value_error:list/tuple"}
    return {"valid": True, "error": []}


def dict_checker(param: str, model_output: dict, possible_answers: list) -> dict:
    """Flat dictionaries: every key of the output in one possible dict with an accepted value, every key of that
    dict without ``""`` among its values present."""
    result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
    for possible_answer in possible_answers:
        if possible_answer == "":
            continue
        result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
        flag = True
        for key, value in model_output.items():
            if key not in possible_answer:
                result["error"].append(f"Unexpected dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break
            standardize_value = standardize_string(value) if type(value) is str else value
            standardized = [standardize_string(a) if type(a) is str else a
                            for a in possible_answer[key]]
            if standardize_value not in standardized:
                result["error"].append(f"Invalid value for parameter {key!r}: {value!r}. Expected one of "
                                       f"{standardized}.")
                result["error_type"] = "value_error:dict_value"
                flag = False
                break
        for key, value in possible_answer.items():
            if key not in model_output and "" not in value:
                result["error"].append(f"Missing dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break
        if flag:
            return {"valid": True, "error": []}
    return result


def list_dict_checker(param: str, model_output: list, possible_answers: list) -> dict:
    """A list of dictionaries, in the order of one possible list, each by :func:`dict_checker`."""
    result = {"valid": False, "error": [], "error_type": "list_dict_checker:unclear"}
    for answer in possible_answers:
        flag = True
        if len(model_output) != len(answer):
            result = {"valid": False, "error": ["Wrong number of dictionaries in the list."],
                      "error_type": "value_error:list_dict_count"}
            continue
        for dict_index in range(len(model_output)):
            result = dict_checker(param, model_output[dict_index], [answer[dict_index]])
            if not result["valid"]:
                flag = False
                break
        if flag:
            return {"valid": True, "error": []}
    return result


# ------------------------------------------------------------------------------------------------ one call
def check_param(param: str, value: Any, param_details: Mapping[str, Any], possible_values: list) -> dict:
    """The verdict on one parameter the model gave (the body of the wheel's per-parameter loop in
    ``simple_function_checker``, Python): the schema's type (``float`` takes an int), the nested item type, then
    the value: dicts by :func:`dict_checker`, lists of dicts by :func:`list_dict_checker`, strings by
    :func:`string_checker`, lists by :func:`list_checker`, anything else (and variables) by membership."""
    full_param_details = param_details[param]
    expected_type_description = full_param_details["type"]
    nested_type_converted = None
    expected_type_converted = PYTHON_TYPE_MAPPING[expected_type_description]
    if expected_type_description in PYTHON_NESTED_TYPE_CHECK_LIST:
        nested_type_converted = PYTHON_TYPE_MAPPING[full_param_details["items"]["type"]]
    if expected_type_description == "tuple" and type(value) is tuple:
        value = list(value)
    if expected_type_description == "float" and type(value) is int:
        value = float(value)

    type_check_result = type_checker(param, value, possible_values, expected_type_description,
                                     expected_type_converted, nested_type_converted)
    if not type_check_result["valid"]:
        return type_check_result
    if not type_check_result["is_variable"]:
        if expected_type_converted is dict:
            return dict_checker(param, value, possible_values)
        if expected_type_converted is list and nested_type_converted is dict:
            return list_dict_checker(param, value, possible_values)
        if expected_type_converted is str:
            return string_checker(param, value, possible_values)
        if expected_type_converted is list:
            return list_checker(param, value, possible_values)
    if value not in possible_values:
        return {"valid": False, "error": [f"Invalid value for parameter {param!r}: {value!r}. Expected one of "
                                          f"{possible_values}."],
                "error_type": "value_error:others"}
    return {"valid": True, "error": []}


def simple_function_checker(func_description: Mapping[str, Any], model_output: Mapping[str, Any],
                            possible_answer: Mapping[str, Any]) -> dict:
    """One call (``{name: params}``) against one possible answer (``{name: {param: values}}``): the name, every
    required parameter present, every given parameter in the schema and the answer and accepted
    (:func:`check_param`), every answer parameter without ``""`` given."""
    possible = next(iter(possible_answer.values()))
    func_name = func_description["name"]
    param_details = func_description["parameters"]["properties"]
    required_params = func_description["parameters"]["required"]
    result = {"valid": True, "error": [], "error_type": "simple_function_checker:unclear"}

    if func_name not in model_output:
        return {"valid": False, "error": [f"Function name {func_name!r} not found in model output."],
                "error_type": "simple_function_checker:wrong_func_name"}
    model_params = model_output[func_name]
    for param in required_params:
        if param not in model_params:
            return {"valid": False, "error": [f"Missing required parameter: {param!r}."],
                    "error_type": "simple_function_checker:missing_required"}
    for param, value in model_params.items():
        if param not in param_details or param not in possible:
            return {"valid": False, "error": [f"Unexpected parameter: {param!r}."],
                    "error_type": "simple_function_checker:unexpected_param"}
        checked = check_param(param, value, param_details, possible[param])
        if not checked["valid"]:
            return checked
    for param in possible:
        if param not in model_params and "" not in possible[param]:
            return {"valid": False, "error": [f"Optional parameter {param!r} not provided and not marked as "
                                              "optional."],
                    "error_type": "simple_function_checker:missing_optional"}
    return result


# ------------------------------------------------------------------------------------------------ whole answers
def parallel_function_checker_no_order(func_descriptions: list, model_output: list, possible_answers: list) -> dict:
    if len(model_output) != len(possible_answers):
        return {"valid": False, "error": ["Wrong number of functions."],
                "error_type": "parallel_function_checker_no_order:wrong_count"}
    matched: list[int] = []
    for i, answer in enumerate(possible_answers):
        func_description = find_description(func_descriptions, next(iter(answer)))
        result: dict = {"valid": False}
        for index in range(len(model_output)):
            if index in matched:
                continue
            result = simple_function_checker(func_description, model_output[index], answer)
            if result["valid"]:
                matched.append(index)
                break
        if not result["valid"]:
            considered = [j for j in range(len(model_output)) if j not in matched]
            return {"valid": False,
                    "error": [f"Could not find a matching function among index {considered} of model output for "
                              f"index {i} of possible answers."],
                    "error_type": "parallel_function_checker_no_order:cannot_find_match"}
    return {"valid": True, "error": []}


def multiple_function_checker(func_descriptions: list, model_output: list, possible_answers: list) -> dict:
    if len(model_output) != len(possible_answers):
        return {"valid": False, "error": ["Wrong number of functions."],
                "error_type": "multiple_function_checker:wrong_count"}
    func_description = find_description(func_descriptions, next(iter(possible_answers[0])))
    return simple_function_checker(func_description, model_output[0], possible_answers[0])


def ast_checker(func_description: list, model_output: list, possible_answer: list, test_category: str) -> dict:
    """BFCL's verdict on one single-turn answer (Python): categories with ``parallel`` in the name match the calls
    in any order, ``multiple`` ones check the one call against the one answer among several functions, the rest
    (``simple_python``, ``live_simple``) need exactly one call."""
    if "parallel" in test_category:
        return parallel_function_checker_no_order(func_description, model_output, possible_answer)
    if "multiple" in test_category:
        return multiple_function_checker(func_description, model_output, possible_answer)
    if len(model_output) != 1:
        return {"valid": False, "error": ["Wrong number of functions."],
                "error_type": "simple_function_checker:wrong_count"}
    return simple_function_checker(func_description[0], model_output[0], possible_answer[0])


def is_function_calling_format_output(decoded_output: Any) -> bool:
    """The wheel's format check (``bfcl_eval.utils``): a list of one-key dicts whose value is a dict."""
    if type(decoded_output) is not list:
        return False
    return all(type(item) is dict and len(item) == 1 and type(next(iter(item.values()))) is dict
               for item in decoded_output)


def safe_ast_checker(func_description: list, model_output: list, possible_answer: list, test_category: str) -> dict:
    """:func:`ast_checker` that never raises on model output: the format check first (``ast_decoder:
    decoder_wrong_output_format``, as the wheel's runner), and an exception inside the checker (a value the
    wheel's code would also crash on) is ``checker:exception``, invalid."""
    if not is_function_calling_format_output(model_output):
        return {"valid": False, "error": ["Did not output in the specified format."],
                "error_type": "ast_decoder:decoder_wrong_output_format"}
    try:
        return ast_checker(func_description, model_output, possible_answer, test_category)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as err:
        return {"valid": False, "error": [f"checker raised {type(err).__name__}: {err}"],
                "error_type": "checker:exception"}


# ------------------------------------------------------------------------------------------------ partial credit
def call_valid(func_descriptions: list, call: Mapping[str, Any], answer: Mapping[str, Any]) -> bool:
    """Whether one predicted call ``{name: params}`` is accepted for one possible-answer call (the check the
    parallel checker makes per pair); never raises."""
    description = find_description(func_descriptions, next(iter(answer)))
    if description is None or not is_function_calling_format_output([call]):
        return False
    try:
        return bool(simple_function_checker(description, call, answer)["valid"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError):
        return False


def param_verdicts(func_descriptions: list, params: Mapping[str, Any], answer: Mapping[str, Any]
                   ) -> tuple[dict[str, bool], set[str], set[str]]:
    """Per parameter of one possible-answer call: whether the predicted ``params`` (of a call with the same
    name) satisfy it as :func:`simple_function_checker` would: given and accepted by :func:`check_param`, or
    left out where ``""`` is among its values. Also the answer's parameters (``allowed``) and those that must
    be given (``needed``: no ``""``). Never raises (a check that raises is a rejection)."""
    name, possible = next(iter(answer.items()))
    description = find_description(func_descriptions, name) or {}
    details = (description.get("parameters") or {}).get("properties") or {}
    verdicts = {}
    for param, values in possible.items():
        if param not in params:
            verdicts[param] = "" in values
            continue
        try:
            verdicts[param] = param in details and bool(check_param(param, params[param], details, values)["valid"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError):
            verdicts[param] = False
    needed = {p for p, values in possible.items() if "" not in values}
    return verdicts, set(possible), needed


def correct_call_ratio(func_descriptions: list, calls: Sequence[Mapping[str, Any]],
                       possible_answer: Sequence[Mapping[str, Any]]) -> float:
    """ToolPO's correct-call ratio under BFCL's rules: each possible-answer call, in order, takes the first unused
    predicted call (``{name: params}``) that :func:`call_valid` accepts; matched / number of answer calls. No
    answer call -> 1, no prediction -> 0 (as ``lit_credit.rewards.hierr.strict_correct_ratio``)."""
    if not possible_answer:
        return 1.0
    if not calls:
        return 0.0
    used: set[int] = set()
    for answer in possible_answer:
        for j, call in enumerate(calls):
            if j not in used and call_valid(func_descriptions, call, answer):
                used.add(j)
                break
    return len(used) / len(possible_answer)


def key_value_scores(func_descriptions: list, calls: Sequence[Mapping[str, Any]],
                     possible_answer: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """HierR's ``(key, value)`` components with BFCL's argument rules, averaged over the possible-answer calls
    that have parameters (none -> (1, 1); no prediction -> (0, 0)). Pairing as HierR's ``key_value_scores``:
    each answer call, in order, takes the unused predicted call of its name that maximises key + value, when
    that sum is above 0. For a pair, with A the answer's parameters, N those without ``""`` (they must be
    given) and K the predicted keys: ``key = |K ∩ A| / |K ∪ N|`` (HierR's Jaccard when every parameter is
    needed; leaving out an optional one costs nothing, an unexpected key does), ``value`` = the share of A
    whose verdict (:func:`param_verdicts`) is right. A call BFCL accepts scores (1, 1)."""
    targets = [a for a in possible_answer if next(iter(a.values()))]
    if not targets:
        return 1.0, 1.0
    if not calls:
        return 0.0, 0.0

    def score(answer: Mapping[str, Any], call: Mapping[str, Any]) -> tuple[float, float] | None:
        name = next(iter(answer))
        if name not in call or not isinstance(call[name], Mapping):
            return None
        verdicts, allowed, needed = param_verdicts(func_descriptions, call[name], answer)
        given = set(call[name])
        union = given | needed
        return (len(given & allowed) / len(union) if union else 1.0), sum(verdicts.values()) / len(allowed)

    return greedy_pair_means(targets, calls, score)


# ------------------------------------------------------------------------------------------------ gold calls
def first_value(param_details: Mapping[str, Any], values: list, required: bool = False) -> tuple[bool, Any]:
    """The first acceptable value of one parameter's possible values, as a concrete argument: ``(False, None)``
    when it is ``""`` (leave the parameter out), unless the schema requires the parameter (the data has
    required parameters whose values start with ``""``, e.g. ``simple_python_200``: the checker rejects the
    omission, so the first other value is taken); a dict parameter's first possible dict (and each dict of a
    list-of-dicts parameter) takes the first value of each of its keys, leaving out keys whose first is ``""``."""
    concrete_values = [v for v in values if v != ""] if required else values[:1]
    if not concrete_values or concrete_values[0] == "":
        return False, None
    value = concrete_values[0]
    kind = param_details.get("type") if isinstance(param_details, Mapping) else None
    items = (param_details.get("items") or {}).get("type") if isinstance(param_details, Mapping) else None

    def concrete(d: Any) -> Any:
        if not isinstance(d, Mapping):
            return d
        return {k: v[0] for k, v in d.items() if isinstance(v, list) and v and v[0] != ""}

    if kind == "dict" and isinstance(value, Mapping):
        return True, concrete(value)
    if kind in PYTHON_NESTED_TYPE_CHECK_LIST and items == "dict" and isinstance(value, list):
        return True, [concrete(d) for d in value]
    return True, value


def gold_calls(func_descriptions: list, possible_answer: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"name", "arguments"}]``: each possible-answer call with the first acceptable value of each parameter
    (:func:`first_value`, a required one never left out, one the schema lacks always). The checker accepts them
    on every entry of the wheel's single-turn data but five whose answers no call satisfies (tested)."""
    out = []
    for answer in possible_answer:
        name, possible = next(iter(answer.items()))
        schema = (find_description(func_descriptions, name) or {}).get("parameters") or {}
        details, required = schema.get("properties") or {}, set(schema.get("required") or [])
        args = {}
        for param, values in possible.items():
            if param not in details:  # the answer names a parameter the schema lacks (parallel_multiple_26)
                continue
            keep, value = first_value(details[param], values, param in required)
            if keep:
                args[param] = value
        out.append({"name": name, "arguments": args})
    return out
