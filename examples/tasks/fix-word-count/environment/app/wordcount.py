"""Word counting."""


def count_words(text):
    """Number of whitespace-separated words in text."""
    if text == "":
        return 0
    return len(text.split(" "))
