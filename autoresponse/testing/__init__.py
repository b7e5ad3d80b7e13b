"""Test doubles: real aiohttp servers on 127.0.0.1 that speak the wire protocol of a
service we cannot run here (an OpenAI-compatible LLM, the Telegram Bot API, Reddit, X).

The tests, the benchmarks and the docs use them; the product never imports them
(``tests/test_layout.py`` checks). Each runs alone too::

    python -m autoresponse.testing.fake_llm --port 8089
"""
