"""The text stream never emits half a character or the start of a stop string."""

import codecs

from speczoo.textstream import TextStream


class ByteDecoder:
    """The tokenizer's IncrementalDecoder where ids are raw bytes: an incomplete tail waits."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids):
        return self._utf8.decode(bytes(ids))

    def flush(self):
        return self._utf8.decode(b"", final=True)


class ByteTok:
    """ids are raw bytes, decoded like a byte-level tokenizer."""

    def incremental_decoder(self):
        return ByteDecoder()


def test_multibyte_character_held_until_complete():
    s = TextStream(ByteTok())
    euro = list("€".encode())
    assert s.push(euro[:1]) == ""
    assert s.push(euro[1:2]) == ""
    assert s.push(euro[2:]) == "€"


def test_stop_string_cut_and_prefix_held():
    s = TextStream(ByteTok(), stop=["END"])
    assert s.push(list(b"abc E")) == "abc "
    assert s.push(list(b"N")) == ""
    assert s.push(list(b"Dxyz")) == ""
    assert s.stopped and s.text == "abc "


def test_false_stop_prefix_released():
    s = TextStream(ByteTok(), stop=["END"])
    assert s.push(list(b"E")) == ""
    assert s.push(list(b"x")) == "Ex"
    assert not s.stopped


def test_flush_releases_held_text():
    s = TextStream(ByteTok(), stop=["END"])
    s.push(list(b"hi EN"))
    assert s.flush() == "EN"
