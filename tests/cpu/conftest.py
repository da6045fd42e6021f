"""CPU tier: the files that compile the most run first. Under pytest-xdist (`-n 2 --dist loadfile`,
as CI runs) a file goes to one worker as a whole, so the long static checks start at once beside
the other files instead of starting last and ending the run alone."""

LONGEST_FIRST = ("test_static.py", "test_fp16acc.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)   # stable: the order within each file, and of the other files, stays
