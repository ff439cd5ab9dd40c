"""Write B2_opencodeinstruct.parquet: 24 rows in nvidia/OpenCodeInstruct's schema.

    python specregen/assets/samples/make_samples.py

All nine upstream columns are strings, as the dataset card gives them. `id` is the md5 of the
input (upstream ids look like 32 hex digits). `unit_tests` are run against `output` here, so
`tests_execution_status` and `average_test_score` are true for the code shipped, not made up.
The prompts and solutions were written for this project (no upstream rows are copied).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent / "B2_opencodeinstruct.parquet"
COLUMNS = (
    "id",
    "input",
    "output",
    "domain",
    "generation_algorithm",
    "llm_judgement",
    "unit_tests",
    "tests_execution_status",
    "average_test_score",
)


def task(text: str, given: str, wanted: str, sample_in: str, sample_out: str) -> str:
    """An input in OpenCodeInstruct's usual layout: task, Input, Output, one sample."""
    return (
        f"{text}\n\n**Input:**\n- {given}\n\n**Output:**\n- {wanted}\n\n"
        f"**Sample Input:**\n```\n{sample_in}\n```\n\n**Sample Output:**\n```\n{sample_out}\n```"
    )


def code(body: str) -> str:
    return f"```python\n{body.strip()}\n```"


# (input, output, domain, generation_algorithm, unit tests, judgement scores)
ROWS: list[tuple[str, str, str, str, list[str], tuple[int, int, int]]] = [
    (
        task(
            "Implement a function `second_largest(numbers)` that returns the second largest "
            "distinct integer in a list, or `None` if there is no such number.",
            "A list of integers `numbers` (0 ≤ len(numbers) ≤ 10^5).",
            "The second largest distinct integer, or `None`.",
            "[4, 1, 7, 7, 3]",
            "4",
        ),
        code('''
def second_largest(numbers):
    """
    Return the second largest distinct integer in numbers, or None.

    :param numbers: List of integers.
    :return: The second largest distinct value, or None if it does not exist.
    """
    distinct = set(numbers)
    if len(distinct) < 2:
        return None
    distinct.remove(max(distinct))
    return max(distinct)
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert second_largest([4, 1, 7, 7, 3]) == 4",
            "assert second_largest([5, 5]) is None",
            "assert second_largest([]) is None",
            "assert second_largest([-2, -1]) == -2",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `is_valid_parentheses(s)` that checks whether every bracket in `s` "
            "is closed by the same type of bracket in the correct order. The string contains "
            "only the characters `()[]{}`.",
            "A string `s` (0 ≤ len(s) ≤ 10^4).",
            "`True` if the brackets are balanced, otherwise `False`.",
            "{[()]}",
            "True",
        ),
        code('''
def is_valid_parentheses(s):
    """
    Check whether the brackets in s are balanced and properly nested.

    :param s: String made of the characters ()[]{}.
    :return: True if balanced, False otherwise.
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
        else:
            stack.append(ch)
    return not stack
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert is_valid_parentheses('{[()]}') is True",
            "assert is_valid_parentheses('([)]') is False",
            "assert is_valid_parentheses('') is True",
            "assert is_valid_parentheses('((') is False",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "You are given a dictionary mapping employee names to their salaries. Write a "
            "function `top_earners(salaries, n)` that returns the names of the `n` best-paid "
            "employees, highest salary first; ties are broken alphabetically.",
            "A dictionary `salaries` (str → int) and an integer `n` ≥ 0.",
            "A list of at most `n` names.",
            '{"Ana": 5200, "Ben": 4800, "Cleo": 5200}, 2',
            '["Ana", "Cleo"]',
        ),
        code('''
def top_earners(salaries, n):
    """
    Return the names of the n highest-paid employees.

    :param salaries: Dictionary mapping names to salaries.
    :param n: Number of names to return.
    :return: List of names, highest salary first, ties alphabetical.
    """
    ranked = sorted(salaries.items(), key=lambda item: (-item[1], item[0]))
    return [name for name, _ in ranked[:n]]
'''),
        "generic",
        "self-instruct",
        [
            "assert top_earners({'Ana': 5200, 'Ben': 4800, 'Cleo': 5200}, 2) == ['Ana', 'Cleo']",
            "assert top_earners({}, 3) == []",
            "assert top_earners({'Ana': 1}, 0) == []",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Implement a function `flatten(nested)` that flattens an arbitrarily nested list of "
            "integers into a single list, preserving order.",
            "A list `nested` whose elements are integers or (nested) lists.",
            "A flat list of integers.",
            "[1, [2, [3, 4]], 5]",
            "[1, 2, 3, 4, 5]",
        ),
        code('''
def flatten(nested):
    """
    Flatten an arbitrarily nested list of integers.

    :param nested: List containing integers and/or lists.
    :return: A flat list of integers in their original order.
    """
    flat = []
    for item in nested:
        if isinstance(item, list):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat
'''),
        "algorithmic",
        "evol-instruct",
        [
            "assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]",
            "assert flatten([]) == []",
            "assert flatten([[[]]]) == []",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Create a class `BankAccount` with methods `deposit(amount)`, `withdraw(amount)` and "
            "`get_balance()`. Deposits and withdrawals must be positive; a withdrawal larger "
            "than the balance raises `ValueError`.",
            "Method calls on a `BankAccount` created with an optional initial balance.",
            "The balance after the operations, or a `ValueError` for invalid operations.",
            "acct = BankAccount(100); acct.deposit(50); acct.withdraw(30); acct.get_balance()",
            "120",
        ),
        code('''
class BankAccount:
    """A simple bank account that refuses overdrafts."""

    def __init__(self, balance=0):
        """
        Create an account.

        :param balance: The initial balance (default 0).
        """
        self._balance = balance

    def deposit(self, amount):
        """Add a positive amount to the balance."""
        if amount <= 0:
            raise ValueError("Deposit amount must be positive")
        self._balance += amount

    def withdraw(self, amount):
        """Remove a positive amount no larger than the balance."""
        if amount <= 0:
            raise ValueError("Withdrawal amount must be positive")
        if amount > self._balance:
            raise ValueError("Insufficient funds")
        self._balance -= amount

    def get_balance(self):
        """Return the current balance."""
        return self._balance
'''),
        "generic",
        "self-instruct",
        [
            "acct = BankAccount(100); acct.deposit(50); acct.withdraw(30); "
            "assert acct.get_balance() == 120",
            "assert BankAccount().get_balance() == 0",
            "acct = BankAccount(10)\ntry:\n    acct.withdraw(20)\n    assert False\n"
            "except ValueError:\n    pass",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `word_frequencies(text)` that counts how often each word occurs "
            "in `text`, case-insensitively, ignoring punctuation.",
            "A string `text` (0 ≤ len(text) ≤ 10^5).",
            "A dictionary mapping each lowercase word to its count.",
            "Hello, world! Hello again.",
            "{'hello': 2, 'world': 1, 'again': 1}",
        ),
        code('''
import re
from collections import Counter


def word_frequencies(text):
    """
    Count word occurrences, case-insensitively and without punctuation.

    :param text: The input text.
    :return: Dictionary of lowercase words to counts.
    """
    return dict(Counter(re.findall(r"[a-z0-9']+", text.lower())))
'''),
        "generic",
        "self-instruct",
        [
            "assert word_frequencies('Hello, world! Hello again.') == "
            "{'hello': 2, 'world': 1, 'again': 1}",
            "assert word_frequencies('') == {}",
            "assert word_frequencies('A a A') == {'a': 3}",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Implement `binary_search(arr, target)` that returns the index of `target` in the "
            "sorted list `arr`, or -1 if it is absent. Use O(log n) time.",
            "A sorted list of integers `arr` and an integer `target`.",
            "The index of `target`, or -1.",
            "[1, 3, 5, 7, 9], 7",
            "3",
        ),
        code('''
def binary_search(arr, target):
    """
    Find target in a sorted list.

    :param arr: Sorted list of integers.
    :param target: The value to look for.
    :return: Index of target, or -1 if absent.
    """
    lo, hi = 0, len(arr) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if arr[mid] == target:
            return mid
        if arr[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert binary_search([1, 3, 5, 7, 9], 7) == 3",
            "assert binary_search([1, 3, 5, 7, 9], 4) == -1",
            "assert binary_search([], 1) == -1",
            "assert binary_search([2], 2) == 0",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `parse_log_line(line)` that parses a log line of the form "
            "`2024-03-01 12:00:01 [ERROR] Disk full` into a dictionary with the keys `date`, "
            "`time`, `level` and `message`. Return `None` for lines that do not match.",
            "A single log line as a string.",
            "A dictionary with the four fields, or `None`.",
            "2024-03-01 12:00:01 [ERROR] Disk full",
            "{'date': '2024-03-01', 'time': '12:00:01', 'level': 'ERROR', 'message': 'Disk full'}",
        ),
        code(r'''
import re

LOG_LINE = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2}) \[(?P<level>[A-Z]+)\] "
    r"(?P<message>.*)$"
)


def parse_log_line(line):
    """
    Parse one log line.

    :param line: A line like '2024-03-01 12:00:01 [ERROR] Disk full'.
    :return: Dictionary with date, time, level and message, or None if malformed.
    """
    match = LOG_LINE.match(line)
    return match.groupdict() if match else None
'''),
        "generic",
        "evol-instruct",
        [
            "assert parse_log_line('2024-03-01 12:00:01 [ERROR] Disk full') == "
            "{'date': '2024-03-01', 'time': '12:00:01', 'level': 'ERROR', 'message': 'Disk full'}",
            "assert parse_log_line('garbage') is None",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Given a list of stock prices where `prices[i]` is the price on day `i`, write "
            "`max_profit(prices)` returning the maximum profit from one buy followed by one "
            "sell. Return 0 if no profit is possible.",
            "A list of non-negative integers `prices` (0 ≤ len(prices) ≤ 10^5).",
            "The maximum profit as an integer.",
            "[7, 1, 5, 3, 6, 4]",
            "5",
        ),
        code('''
def max_profit(prices):
    """
    Maximum profit from a single buy and a later sell.

    :param prices: List of daily prices.
    :return: The best achievable profit, or 0.
    """
    best = 0
    lowest = float("inf")
    for price in prices:
        lowest = min(lowest, price)
        best = max(best, price - lowest)
    return best
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert max_profit([7, 1, 5, 3, 6, 4]) == 5",
            "assert max_profit([7, 6, 4, 3, 1]) == 0",
            "assert max_profit([]) == 0",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `merge_dicts(a, b)` that deep-merges dictionary `b` into a copy of "
            "dictionary `a`: nested dictionaries are merged recursively, any other value in `b` "
            "replaces the one in `a`. Neither input may be modified.",
            "Two dictionaries `a` and `b`.",
            "A new merged dictionary.",
            '{"db": {"host": "x", "port": 1}}, {"db": {"port": 2}}',
            "{'db': {'host': 'x', 'port': 2}}",
        ),
        code('''
import copy


def merge_dicts(a, b):
    """
    Deep-merge b into a copy of a.

    :param a: Base dictionary.
    :param b: Dictionary whose values take precedence.
    :return: A new merged dictionary; a and b are left unchanged.
    """
    merged = copy.deepcopy(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_dicts(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
'''),
        "generic",
        "evol-instruct",
        [
            "assert merge_dicts({'db': {'host': 'x', 'port': 1}}, {'db': {'port': 2}}) == "
            "{'db': {'host': 'x', 'port': 2}}",
            "a = {'k': {'v': 1}}; merge_dicts(a, {'k': {'v': 2}}); assert a == {'k': {'v': 1}}",
            "assert merge_dicts({}, {}) == {}",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Implement `roman_to_int(s)` that converts a Roman numeral to an integer.",
            "A valid Roman numeral `s` representing a value from 1 to 3999.",
            "The integer value.",
            "MCMXCIV",
            "1994",
        ),
        code('''
def roman_to_int(s):
    """
    Convert a Roman numeral to an integer.

    :param s: A valid Roman numeral.
    :return: Its integer value.
    """
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for current, following in zip(s, s[1:] + " "):
        value = values[current]
        total += -value if value < values.get(following, 0) else value
    return total
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert roman_to_int('MCMXCIV') == 1994",
            "assert roman_to_int('III') == 3",
            "assert roman_to_int('IX') == 9",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `chunk(items, size)` that splits a list into consecutive chunks of "
            "length `size` (the last chunk may be shorter). Raise `ValueError` if `size` < 1.",
            "A list `items` and an integer `size`.",
            "A list of lists.",
            "[1, 2, 3, 4, 5], 2",
            "[[1, 2], [3, 4], [5]]",
        ),
        code('''
def chunk(items, size):
    """
    Split items into consecutive chunks of the given size.

    :param items: The list to split.
    :param size: Chunk length, at least 1.
    :return: List of chunks.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    return [items[i:i + size] for i in range(0, len(items), size)]
'''),
        "generic",
        "self-instruct",
        [
            "assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
            "assert chunk([], 3) == []",
            "try:\n    chunk([1], 0)\n    assert False\nexcept ValueError:\n    pass",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Implement `fibonacci(n)` that returns the n-th Fibonacci number (F(0) = 0, "
            "F(1) = 1) in O(n) time and O(1) space.",
            "An integer `n` (0 ≤ n ≤ 90).",
            "The n-th Fibonacci number.",
            "10",
            "55",
        ),
        code('''
def fibonacci(n):
    """
    Compute the n-th Fibonacci number iteratively.

    :param n: Non-negative index.
    :return: F(n).
    """
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert fibonacci(0) == 0",
            "assert fibonacci(1) == 1",
            "assert fibonacci(10) == 55",
            "assert fibonacci(90) == 2880067194370816120",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `validate_email(address)` that returns `True` for addresses of "
            "the form `local@domain.tld`, where the local part holds letters, digits, dots, "
            "underscores, plus signs or hyphens, and the domain has at least one dot.",
            "A string `address`.",
            "`True` or `False`.",
            "jane.doe+news@example.co.uk",
            "True",
        ),
        code(r'''
import re

EMAIL = re.compile(r"^[A-Za-z0-9._+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


def validate_email(address):
    """
    Check an email address against a simple pattern.

    :param address: The address to check.
    :return: True if it looks valid, False otherwise.
    """
    return bool(EMAIL.match(address))
'''),
        "generic",
        "evol-instruct",
        [
            "assert validate_email('jane.doe+news@example.co.uk') is True",
            "assert validate_email('no-at-sign.example.com') is False",
            "assert validate_email('a@localhost') is False",
        ],
        (4, 5, 3),
    ),
    (
        task(
            "Given an `m x n` grid of `'1'` (land) and `'0'` (water), write `count_islands(grid)` "
            "that returns the number of islands. An island is land connected horizontally or "
            "vertically.",
            "A list of lists of the strings '0' and '1'.",
            "The number of islands.",
            '[["1","1","0"],["0","1","0"],["0","0","1"]]',
            "2",
        ),
        code('''
def count_islands(grid):
    """
    Count 4-connected groups of '1' cells.

    :param grid: List of rows of '0'/'1' strings.
    :return: Number of islands.
    """
    if not grid:
        return 0
    rows, cols = len(grid), len(grid[0])
    seen = set()
    islands = 0
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] != "1" or (r, c) in seen:
                continue
            islands += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == "1":
                        if (ny, nx) not in seen:
                            seen.add((ny, nx))
                            stack.append((ny, nx))
    return islands
'''),
        "algorithmic",
        "evol-instruct",
        [
            "assert count_islands([['1','1','0'],['0','1','0'],['0','0','1']]) == 2",
            "assert count_islands([]) == 0",
            "assert count_islands([['0']]) == 0",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `celsius_to_fahrenheit(temps)` that converts a list of Celsius "
            "temperatures to Fahrenheit, rounded to one decimal place.",
            "A list of numbers.",
            "A list of floats.",
            "[0, 37, -40]",
            "[32.0, 98.6, -40.0]",
        ),
        code('''
def celsius_to_fahrenheit(temps):
    """
    Convert Celsius temperatures to Fahrenheit.

    :param temps: List of temperatures in Celsius.
    :return: List of temperatures in Fahrenheit, rounded to one decimal.
    """
    return [round(t * 9 / 5 + 32, 1) for t in temps]
'''),
        "generic",
        "self-instruct",
        [
            "assert celsius_to_fahrenheit([0, 37, -40]) == [32.0, 98.6, -40.0]",
            "assert celsius_to_fahrenheit([]) == []",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Implement `longest_common_prefix(words)` that returns the longest prefix shared by "
            "all strings in `words`, or an empty string.",
            "A list of strings (0 ≤ len(words) ≤ 200).",
            "The longest common prefix.",
            '["flower", "flow", "flight"]',
            "fl",
        ),
        code('''
def longest_common_prefix(words):
    """
    Longest prefix common to all words.

    :param words: List of strings.
    :return: The shared prefix, possibly empty.
    """
    if not words:
        return ""
    shortest, longest = min(words), max(words)
    for i, ch in enumerate(shortest):
        if ch != longest[i]:
            return shortest[:i]
    return shortest
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert longest_common_prefix(['flower', 'flow', 'flight']) == 'fl'",
            "assert longest_common_prefix(['dog', 'racecar']) == ''",
            "assert longest_common_prefix([]) == ''",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a class `LRUCache` with a fixed `capacity` and the methods `get(key)` "
            "(return the value or -1) and `put(key, value)`, evicting the least recently used "
            "key when full. Both methods must run in O(1).",
            "A sequence of `get`/`put` calls.",
            "The results of the `get` calls.",
            "c = LRUCache(2); c.put(1, 1); c.put(2, 2); c.get(1); c.put(3, 3); c.get(2)",
            "1\n-1",
        ),
        code('''
from collections import OrderedDict


class LRUCache:
    """A least-recently-used cache with O(1) get and put."""

    def __init__(self, capacity):
        """
        :param capacity: Maximum number of entries.
        """
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key):
        """Return the value for key and mark it as recently used, or -1."""
        if key not in self._data:
            return -1
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        """Insert or update key, evicting the least recently used entry if needed."""
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)
'''),
        "algorithmic",
        "evol-instruct",
        [
            "c = LRUCache(2); c.put(1, 1); c.put(2, 2); assert c.get(1) == 1; c.put(3, 3); "
            "assert c.get(2) == -1",
            "c = LRUCache(1); c.put(1, 1); c.put(1, 2); assert c.get(1) == 2",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `format_duration(seconds)` that formats a number of seconds as a "
            "human-readable string such as `1h 2m 5s`, omitting zero parts. Zero seconds is "
            "`0s`.",
            "A non-negative integer `seconds`.",
            "The formatted duration.",
            "3725",
            "1h 2m 5s",
        ),
        code('''
def format_duration(seconds):
    """
    Format seconds as 'Xh Ym Zs', leaving out zero parts.

    :param seconds: Non-negative number of seconds.
    :return: Human-readable duration.
    """
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{unit}" for v, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return " ".join(parts) or "0s"
'''),
        "generic",
        "self-instruct",
        [
            "assert format_duration(3725) == '1h 2m 5s'",
            "assert format_duration(0) == '0s'",
            "assert format_duration(60) == '1m'",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Implement `rotate_matrix(matrix)` that rotates a square matrix 90 degrees clockwise "
            "and returns the new matrix.",
            "An `n x n` list of lists.",
            "The rotated matrix.",
            "[[1, 2], [3, 4]]",
            "[[3, 1], [4, 2]]",
        ),
        code('''
def rotate_matrix(matrix):
    """
    Rotate a square matrix 90 degrees clockwise.

    :param matrix: n x n list of lists.
    :return: A new rotated matrix.
    """
    return [list(row) for row in zip(*matrix[::-1])]
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert rotate_matrix([[1, 2], [3, 4]]) == [[3, 1], [4, 2]]",
            "assert rotate_matrix([]) == []",
            "assert rotate_matrix([[1]]) == [[1]]",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Write `group_anagrams(words)` that groups words that are anagrams of each other. "
            "Return the groups in order of first appearance, each group in input order.",
            "A list of lowercase strings.",
            "A list of lists of strings.",
            '["eat", "tea", "tan", "ate", "nat", "bat"]',
            '[["eat", "tea", "ate"], ["tan", "nat"], ["bat"]]',
        ),
        code('''
def group_anagrams(words):
    """
    Group anagrams together, keeping first-appearance order.

    :param words: List of lowercase words.
    :return: List of anagram groups.
    """
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return list(groups.values())
'''),
        "algorithmic",
        "evol-instruct",
        [
            "assert group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat', 'bat']) == "
            "[['eat', 'tea', 'ate'], ['tan', 'nat'], ['bat']]",
            "assert group_anagrams([]) == []",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `csv_to_dicts(text)` that parses CSV text with a header row into a "
            "list of dictionaries. Quoted fields may contain commas.",
            "A string holding CSV data with a header line.",
            "A list of dictionaries, one per data row.",
            'name,city\\nAna,"Lisbon, PT"',
            "[{'name': 'Ana', 'city': 'Lisbon, PT'}]",
        ),
        code('''
import csv
import io


def csv_to_dicts(text):
    """
    Parse CSV text with a header row.

    :param text: CSV data as a string.
    :return: List of dictionaries keyed by the header fields.
    """
    return list(csv.DictReader(io.StringIO(text)))
'''),
        "generic",
        "self-instruct",
        [
            "assert csv_to_dicts('name,city\\nAna,\"Lisbon, PT\"') == "
            "[{'name': 'Ana', 'city': 'Lisbon, PT'}]",
            "assert csv_to_dicts('a,b\\n') == []",
        ],
        (5, 5, 4),
    ),
    (
        task(
            "Implement `primes_up_to(n)` that returns all prime numbers ≤ n using the Sieve of "
            "Eratosthenes.",
            "An integer `n` (0 ≤ n ≤ 10^6).",
            "A sorted list of primes.",
            "20",
            "[2, 3, 5, 7, 11, 13, 17, 19]",
        ),
        code('''
def primes_up_to(n):
    """
    All primes up to n (inclusive) by the Sieve of Eratosthenes.

    :param n: Upper bound.
    :return: Sorted list of primes.
    """
    if n < 2:
        return []
    sieve = [True] * (n + 1)
    sieve[0] = sieve[1] = False
    for p in range(2, int(n ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = [False] * len(range(p * p, n + 1, p))
    return [i for i, is_prime in enumerate(sieve) if is_prime]
'''),
        "algorithmic",
        "self-instruct",
        [
            "assert primes_up_to(20) == [2, 3, 5, 7, 11, 13, 17, 19]",
            "assert primes_up_to(1) == []",
            "assert primes_up_to(2) == [2]",
        ],
        (5, 5, 5),
    ),
    (
        task(
            "Write a function `mask_card_number(number)` that masks all but the last four digits "
            "of a credit card number with `*`, keeping spaces and hyphens in place.",
            "A string of digits, spaces and hyphens.",
            "The masked string.",
            "4111-1111-1111-1234",
            "****-****-****-1234",
        ),
        code('''
def mask_card_number(number):
    """
    Mask all digits except the last four.

    :param number: Card number, possibly with spaces or hyphens.
    :return: The masked card number.
    """
    digits_left = sum(ch.isdigit() for ch in number)
    masked = []
    for ch in number:
        if ch.isdigit():
            masked.append(ch if digits_left <= 4 else "*")
            digits_left -= 1
        else:
            masked.append(ch)
    return "".join(masked)
'''),
        "generic",
        "evol-instruct",
        [
            "assert mask_card_number('4111-1111-1111-1234') == '****-****-****-1234'",
            "assert mask_card_number('1234') == '1234'",
            "assert mask_card_number('12 3456') == '** 3456'",
        ],
        (5, 5, 5),
    ),
]


def run_tests(output: str, tests: list[str]) -> list[str]:
    """Run each test against the solution; the status list the dataset reports."""
    source = output.removeprefix("```python\n").removesuffix("\n```")
    statuses = []
    for test in tests:
        namespace: dict[str, object] = {}
        try:
            exec(source, namespace)
            exec(test, namespace)
        except Exception:
            statuses.append("fail")
        else:
            statuses.append("pass")
    return statuses


def judgement(scores: tuple[int, int, int]) -> str:
    conformance, correctness, edge_cases = scores
    return json.dumps(
        {
            "requirement_conformance": {
                "score": conformance,
                "justification": "The solution implements the function as specified."
                if conformance == 5
                else "The solution meets the main requirements with minor gaps.",
            },
            "logical_correctness": {
                "score": correctness,
                "justification": "The logic is correct and consistent.",
            },
            "edge_case_consideration": {
                "score": edge_cases,
                "justification": "Empty and boundary inputs are handled."
                if edge_cases == 5
                else "Most edge cases are handled; some unusual inputs are not considered.",
            },
        }
    )


def build_rows() -> list[dict[str, str]]:
    rows = []
    for text, output, domain, algorithm, tests, scores in ROWS:
        statuses = run_tests(output, tests)
        rows.append(
            {
                "id": hashlib.md5(text.encode("utf-8")).hexdigest(),
                "input": text,
                "output": output,
                "domain": domain,
                "generation_algorithm": algorithm,
                "llm_judgement": judgement(scores),
                "unit_tests": json.dumps(tests),
                "tests_execution_status": json.dumps(statuses),
                "average_test_score": str(statuses.count("pass") / len(statuses)),
            }
        )
    return rows


def main() -> None:
    rows = build_rows()
    schema = pa.schema([(name, pa.string()) for name in COLUMNS])
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, OUT, compression="zstd")
    print(f"wrote {len(rows)} rows to {OUT}")
    failing = [r["id"] for r in rows if r["average_test_score"] != "1.0"]
    if failing:
        print(f"rows whose unit tests fail: {failing}")


if __name__ == "__main__":
    main()
