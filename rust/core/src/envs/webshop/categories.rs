//! Static data of the WebShop catalogue: product categories with their types, attributes,
//! materials, option dimensions and price ranges.

/// A product category: type nouns, attribute pool, materials, option dimensions, price range.
pub struct CategoryDef {
    pub name: &'static str,
    pub nouns: &'static [&'static str],
    pub attributes: &'static [&'static str],
    pub materials: &'static [&'static str],
    /// (dimension, values); values are unique within a category.
    pub options: &'static [(&'static str, &'static [&'static str])],
    /// Price range in whole dollars.
    pub price: (u32, u32),
}

const COLORS: &[&str] = &[
    "black", "white", "blue", "red", "gray", "green", "pink", "navy",
];

pub static CATEGORIES: &[CategoryDef] = &[
    CategoryDef {
        name: "headphones",
        nouns: &["headphones", "headset", "earbuds"],
        attributes: &[
            "wireless",
            "bluetooth",
            "noise cancelling",
            "over ear",
            "with microphone",
            "waterproof",
            "foldable",
            "long battery life",
        ],
        materials: &["plastic", "aluminum", "memory foam"],
        options: &[(
            "color",
            &["black", "white", "blue", "red", "silver", "pink"],
        )],
        price: (15, 250),
    },
    CategoryDef {
        name: "shoes",
        nouns: &["running shoes", "sneakers", "hiking boots", "sandals"],
        attributes: &[
            "non slip",
            "lightweight",
            "waterproof",
            "breathable",
            "memory foam insole",
            "wide fit",
            "slip on",
            "rubber sole",
        ],
        materials: &["mesh", "leather", "suede", "canvas"],
        options: &[
            ("color", &["black", "white", "gray", "navy", "red", "beige"]),
            ("size", &["6", "7", "8", "9", "10", "11", "12"]),
        ],
        price: (25, 180),
    },
    CategoryDef {
        name: "laptops",
        nouns: &["laptop", "notebook", "chromebook"],
        attributes: &[
            "touchscreen",
            "backlit keyboard",
            "16gb ram",
            "fingerprint reader",
            "lightweight",
            "long battery life",
            "ssd storage",
        ],
        materials: &["aluminum", "plastic", "magnesium alloy"],
        options: &[
            ("color", &["silver", "black", "gray"]),
            ("storage", &["256gb", "512gb", "1tb"]),
        ],
        price: (250, 2000),
    },
    CategoryDef {
        name: "coffee makers",
        nouns: &["coffee maker", "espresso machine", "french press"],
        attributes: &[
            "programmable",
            "stainless steel",
            "single serve",
            "built in grinder",
            "dishwasher safe",
            "auto shut off",
            "thermal carafe",
        ],
        materials: &["glass", "plastic", "ceramic"],
        options: &[("color", &["black", "silver", "red", "white"])],
        price: (20, 400),
    },
    CategoryDef {
        name: "t-shirts",
        nouns: &["t-shirt", "tank top", "polo shirt"],
        attributes: &[
            "cotton",
            "slim fit",
            "short sleeve",
            "machine washable",
            "moisture wicking",
            "crew neck",
            "v neck",
            "relaxed fit",
        ],
        materials: &["cotton blend", "polyester", "linen"],
        options: &[
            ("color", COLORS),
            ("size", &["small", "medium", "large", "x-large"]),
        ],
        price: (8, 45),
    },
    CategoryDef {
        name: "backpacks",
        nouns: &["backpack", "laptop bag", "duffel bag"],
        attributes: &[
            "water resistant",
            "laptop compartment",
            "lightweight",
            "anti theft",
            "usb charging port",
            "padded straps",
        ],
        materials: &["nylon", "canvas", "polyester"],
        options: &[("color", COLORS)],
        price: (20, 150),
    },
    CategoryDef {
        name: "phone cases",
        nouns: &["phone case", "wallet case"],
        attributes: &[
            "shockproof",
            "slim",
            "clear",
            "card holder",
            "magnetic",
            "kickstand",
        ],
        materials: &["silicone", "leather", "tpu"],
        options: &[
            (
                "color",
                &["black", "clear", "blue", "pink", "green", "purple"],
            ),
            (
                "model",
                &["iphone 14", "iphone 15", "galaxy s23", "pixel 8"],
            ),
        ],
        price: (6, 40),
    },
    CategoryDef {
        name: "lamps",
        nouns: &["desk lamp", "floor lamp", "night light"],
        attributes: &[
            "led",
            "dimmable",
            "usb charging",
            "touch control",
            "adjustable arm",
            "remote control",
            "eye caring",
        ],
        materials: &["metal", "wood", "plastic"],
        options: &[("color", &["black", "white", "silver", "gold"])],
        price: (12, 120),
    },
    CategoryDef {
        name: "water bottles",
        nouns: &["water bottle", "travel mug", "tumbler"],
        attributes: &[
            "insulated",
            "bpa free",
            "leak proof",
            "stainless steel",
            "dishwasher safe",
            "with straw",
        ],
        materials: &["metal", "glass", "tritan"],
        options: &[
            ("color", COLORS),
            ("capacity", &["12 oz", "20 oz", "32 oz", "40 oz"]),
        ],
        price: (8, 50),
    },
    CategoryDef {
        name: "yoga mats",
        nouns: &["yoga mat", "exercise mat"],
        attributes: &[
            "non slip",
            "extra thick",
            "eco friendly",
            "with carrying strap",
            "alignment lines",
            "sweat resistant",
        ],
        materials: &["tpe", "natural rubber", "pvc"],
        options: &[(
            "color",
            &["purple", "blue", "black", "pink", "green", "gray"],
        )],
        price: (12, 90),
    },
    CategoryDef {
        name: "hair care",
        nouns: &["shampoo", "conditioner", "hair mask"],
        attributes: &[
            "sulfate free",
            "paraben free",
            "for dry hair",
            "natural ingredients",
            "color safe",
            "anti dandruff",
            "vegan",
        ],
        materials: &["argan oil", "coconut oil", "tea tree oil"],
        options: &[("size", &["8 oz", "12 oz", "16 oz", "32 oz"])],
        price: (5, 40),
    },
    CategoryDef {
        name: "chairs",
        nouns: &["office chair", "gaming chair", "desk chair"],
        attributes: &[
            "ergonomic",
            "lumbar support",
            "adjustable height",
            "mesh back",
            "padded armrests",
            "reclining",
            "swivel",
        ],
        materials: &["mesh", "faux leather", "fabric"],
        options: &[("color", &["black", "gray", "white", "blue", "red"])],
        price: (60, 500),
    },
];

/// Closing sentences of product descriptions.
pub const TAGLINES: &[&str] = &[
    "Ideal for everyday use.",
    "A great gift for family and friends.",
    "Backed by a one year warranty.",
    "Designed for comfort and durability.",
    "Easy to clean and built to last.",
    "Our best seller this season.",
];
