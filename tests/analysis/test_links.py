"""A view as a link (analysis.session.links): each field read as its kind, every refusal named, and a written
link read back to the same values."""

from analysis import LINK_FIELDS, link_query, parse_link


def test_a_link_is_read_field_by_field_as_its_kind():
    values, problems = parse_link({"model": "cnn-l0.5", "layer": "stages.1.0.conv1", "row": "10", "col": "+3",
                                   "alpha": ".25", "k": "9", "tab": "spectrum"})
    assert problems == []
    assert values == {"model": "cnn-l0.5", "layer": "stages.1.0.conv1", "row": 10, "col": 3, "alpha": 0.25, "k": 9,
                      "tab": "spectrum"}


def test_every_value_a_link_cannot_hold_is_refused_by_name_and_left_out():
    values, problems = parse_link({"row": "1e3", "k": "2.5", "model": "../../etc/passwd", "layer": "a" * 200,
                                   "alpha": "nan", "seed": "", "secret": "1", "image": ["cat_0"],
                                   "compare": "cnn-l0,", "depth": "0.5.5"})
    assert values == {}
    assert len(problems) == 10
    named = " ".join(problems)
    for name in ("row", "k", "model", "layer", "alpha", "seed", "`secret`", "image", "compare", "depth"):
        assert name in named
    assert "a" * 41 not in named  # no value is echoed at length


def test_a_written_link_reads_back_to_the_same_values_in_field_order():
    fields = {"tab": "mix", "row": 31, "model": "vit-convnn16", "alpha": 0.75, "head": 2, "seed": None,
              "depth": 0.25, "compare": ["cnn-l0", "cnn-l0.5"]}
    query = link_query(fields)
    assert query == "model=vit-convnn16&row=31&alpha=0.75&head=2&tab=mix&compare=cnn-l0,cnn-l0.5&depth=0.25"
    values, problems = parse_link(dict(pair.split("=") for pair in query.split("&")))
    assert problems == [] and values == {key: value for key, value in fields.items() if value is not None}
    assert list(values) == [key for key in LINK_FIELDS if key in values]


def test_a_refusal_never_echoes_markup():
    """The messages are page markup: a field name or value with anything but plain characters is not shown."""
    _, problems = parse_link({"<img src=x onerror=alert(1)>": "1", "model": "[x](javascript:alert(1))",
                              "row": "**9**"})
    assert len(problems) == 3
    for problem in problems:
        assert "not shown" in problem
        assert not any(mark in problem for mark in ("<", ">", "[", "]", "*", "javascript", "onerror"))


def test_gradio_and_tracker_fields_pass_over_and_any_float_reads_back():
    values, problems = parse_link({"__theme": "dark", "view": "api", "utm_source": "x", "fbclid": "1",
                                   "alpha": repr(1e-05), "seed": str(2**63 - 1)})
    assert problems == [] and values == {"alpha": 1e-05, "seed": 2**63 - 1}
    _, problems = parse_link({"tab": "__proto__"})
    assert problems == [] or "`__proto__`" in problems[0]  # a plain name is echoed as code: nothing renders


def test_a_link_of_many_unknown_names_gets_one_bounded_message():
    """Each unknown name once added a whole message: 6,000 of them gave a 905 KB note."""
    _, problems = parse_link({f"x{number}": "1" for number in range(6000)} | {"row": "no"})
    assert len(problems) == 2
    assert problems[0].startswith("the link's `x0`, `x1`, `x2`, `x3`, `x4` and 5,995 more are not something")
    assert len(" ".join(problems)) < 1000
    _, problems = parse_link({"secret": "1"})
    assert problems[0].startswith("the link's `secret` is not something a link sets")


def test_the_field_the_server_puts_in_place_of_a_link_too_long_says_so():
    """A link longer than MAX_LINK_BYTES reaches the page as its length alone (server.RequestSizeLimit)."""
    values, problems = parse_link({"link_too_long": "15407", "row": "3"})
    assert values == {"row": 3} and problems == [
        "the link was too long to read (`15407` bytes; a link to the explorer is at most 2,048, one the page writes "
        "far shorter): check where it came from"]
    assert "<" not in parse_link({"link_too_long": "<b>"})[1][0]  # echoed as any value: plain, or not shown
