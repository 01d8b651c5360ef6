"""The persistent-world suite's vocabulary: rooms, world names, holders, adjectives and object nouns.

Tuples only (their order is part of what a seed generates: append, never reorder). Kept apart from the
generator (:mod:`routers.memagent.worlds`) so it stays readable.
"""

ROOMS = ("hallway", "pantry", "attic", "cellar", "garage", "study", "bedroom", "bathroom", "library", "workshop",
         "scullery", "sunroom", "office", "nursery", "storeroom", "gallery", "lounge", "vestibule", "larder", "den")
HUBS = ("kitchen", "foyer", "parlor", "porch")
WORLD_NAMES = ("Harbor House", "Maple Cottage", "Granite Manor", "Willow Lodge", "Cedar Villa", "Amber Hall",
               "Birch Cabin", "Copper Farmhouse", "Elm Bungalow", "Juniper House", "Linden Manor", "Oak Cottage")
CONTAINERS = ("chest", "cabinet", "crate", "locker", "trunk", "basket", "toolbox", "wardrobe", "coffer", "bin")
SUPPORTERS = ("shelf", "desk", "workbench", "bench", "stand", "sideboard", "rack", "dresser", "counter", "ledge")
ADJECTIVES = ("red", "blue", "green", "yellow", "silver", "golden", "wooden", "old", "small", "shiny", "black",
              "white")
NOUNS = ("key", "ball", "coin", "book", "lamp", "cup", "map", "ring", "candle", "hat", "bell", "spoon", "scarf",
         "flute", "compass", "glove", "kettle", "vase", "whistle", "brush", "feather", "mirror", "clock", "button")
# with ``unique_objects`` each site holds objects of one kind (a toolbox of tools), and no noun is in two sites
# of a suite: a memory about an object (and, by its kind, about a site) belongs to one world and one site
OBJECT_CATEGORIES = {
    "kitchenware": ("teapot", "ladle", "whisk", "skillet", "grater", "sieve", "saucer", "platter", "tureen"),
    "instruments": ("harmonica", "violin", "trumpet", "drum", "banjo", "kazoo", "flute", "whistle", "bell"),
    "jewelry": ("locket", "pendant", "bracelet", "brooch", "tiara", "anklet", "earring", "necklace", "ring"),
    "tools": ("hammer", "chisel", "wrench", "trowel", "pliers", "screwdriver", "saw", "drill", "file"),
    "toys": ("puppet", "yoyo", "kite", "marble", "domino", "dice", "rattle", "teddy", "doll"),
    "stationery": ("diary", "ledger", "scroll", "quill", "inkwell", "stamp", "envelope", "postcard", "notebook"),
    "navigation": ("telescope", "sextant", "hourglass", "abacus", "globe", "atlas", "compass", "clock", "barometer"),
    "clothing": ("scarf", "hat", "glove", "cane", "helmet", "goggles", "umbrella", "parasol", "boot"),
    "sewing": ("needle", "spindle", "bobbin", "thimble", "scissors", "yarn", "button", "ribbon", "pincushion"),
    # added after generator version 4; used only by suites with more sites than the nine kinds above hold
    "gardening": ("spade", "rake", "hoe", "shears", "sickle", "pitchfork", "wheelbarrow", "sprinkler", "mattock"),
    "fruit": ("apple", "pear", "plum", "lemon", "melon", "peach", "cherry", "mango", "grape"),
    "sports": ("racket", "shuttlecock", "frisbee", "javelin", "discus", "baton", "skates", "paddle", "dumbbell"),
}
CATEGORY_SIZE = 9
FIRST_CATEGORIES = 9   # the kinds of generator version 4: suites they can hold are generated exactly as then
# ``world_moved_object: spare``: one dedicated object per site of a seen world, named by no other task of the
# suite (seen world i's site k takes noun n_sites * i + k), moved to the hub in that site's moved task
SPARE_NOUNS = ("lantern", "anchor", "trophy", "candlestick", "statuette", "figurine", "horseshoe", "thermos",
               "binoculars", "camera", "radio", "typewriter", "gramophone", "microscope", "magnifier", "padlock",
               "pinecone", "seashell", "fossil", "crystal", "acorn", "bottle", "jar", "flask", "goblet", "chalice",
               "mask", "fan", "wand", "torch", "shield", "sword", "dagger", "quiver", "lunchbox", "birdcage")
