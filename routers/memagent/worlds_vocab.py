"""The persistent-world suite's vocabulary: rooms, world names, holders, adjectives and object nouns.

Tuples only (their order is part of what a seed generates: append, never reorder). Kept apart from the
generator (:mod:`routers.memagent.worlds`) so it stays readable.
"""

ROOMS = ("hallway", "pantry", "attic", "cellar", "garage", "study", "bedroom", "bathroom", "library", "workshop",
         "scullery", "sunroom", "office", "nursery", "storeroom", "gallery", "lounge", "vestibule", "larder", "den")
HUBS = ("kitchen", "foyer", "parlor", "porch")
WORLD_NAMES = ("Harbor House", "Maple Cottage", "Granite Manor", "Willow Lodge", "Cedar Villa", "Amber Hall",
               "Birch Cabin", "Copper Farmhouse", "Elm Bungalow", "Juniper House", "Linden Manor", "Oak Cottage",
               "Hazel Grange", "Aspen Lodge", "Rowan Hall", "Poplar Cottage", "Spruce Manor", "Sycamore House",
               "Alder Farmhouse", "Chestnut Villa", "Beech Cabin", "Holly Bungalow")
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
    # added for suites of up to 22 worlds (3 sites each); the suites above generate as before (CATEGORY_GROUPS)
    "gems": ("ruby", "emerald", "sapphire", "opal", "topaz", "amethyst", "garnet", "jade", "onyx"),
    "vegetables": ("carrot", "turnip", "radish", "cabbage", "leek", "parsnip", "beet", "squash", "pumpkin"),
    "office": ("stapler", "paperclip", "ruler", "eraser", "pencil", "crayon", "calculator", "folder", "binder"),
    "washing": ("sponge", "towel", "razor", "comb", "soap", "loofah", "toothbrush", "washcloth", "bathrobe"),
    "pottery": ("urn", "jug", "pitcher", "bowl", "mug", "teacup", "amphora", "crock", "ewer"),
    "games": ("chessboard", "pawn", "checker", "cribbage", "jigsaw", "puzzle", "spinner", "token", "scorecard"),
    "electronics": ("battery", "cable", "headphones", "speaker", "keyboard", "joystick", "antenna", "transistor",
                    "modem"),
    "pastry": ("spatula", "muffin", "biscuit", "cookie", "pretzel", "bagel", "croissant", "scone", "cupcake"),
    "fishing": ("rod", "reel", "lure", "net", "bobber", "tackle", "hook", "sinker", "creel"),
    "medicine": ("bandage", "syringe", "thermometer", "stethoscope", "ointment", "pillbox", "splint", "tweezers",
                 "inhaler"),
}
CATEGORY_SIZE = 9
# kinds are filled group by group (round-robin within a group): appending a group never changes the sites of a
# suite the earlier groups hold (generator version 4: the first 9 kinds; then up to 12 worlds; then up to 22)
CATEGORY_GROUPS = (9, 12, 22)
# ``world_moved_object: spare``: one dedicated object per site of a seen world, named by no other task of the
# suite (seen world i's site k takes noun n_sites * i + k), moved to the hub in that site's moved task
SPARE_NOUNS = ("lantern", "anchor", "trophy", "candlestick", "statuette", "figurine", "horseshoe", "thermos",
               "binoculars", "camera", "radio", "typewriter", "gramophone", "microscope", "magnifier", "padlock",
               "pinecone", "seashell", "fossil", "crystal", "acorn", "bottle", "jar", "flask", "goblet", "chalice",
               "mask", "fan", "wand", "torch", "shield", "sword", "dagger", "quiver", "lunchbox", "birdcage",
               # for up to 22 seen worlds
               "pinwheel", "weathervane", "sundial", "lodestone", "relic", "idol", "totem", "medallion", "amulet",
               "talisman", "scepter", "crown", "orb", "chalk", "slate", "easel", "palette", "kaleidoscope",
               "metronome", "snowglobe", "gyroscope", "periscope", "spyglass", "windmill", "cymbal", "tambourine",
               "ocarina", "bugle", "lute", "sitar")
