//! Text rendering of the WebShop pages. Clickable elements appear in square brackets.

use super::catalogue::{Catalogue, Product};
use super::goal::Reward;
use super::PER_PAGE;

pub const INSTRUCTIONS: &str = "You are shopping on a web store to satisfy an instruction. \
Each observation is the current web page; clickable elements are shown in square brackets. \
Actions:\n\
- search[query]: search the store (only on the search page)\n\
- click[element]: click a product id, an option value (e.g. click[black]), click[next >], \
click[< prev], click[back to search] or click[buy now]\n\
- back: go to the previous page; buy: same as click[buy now]\n\
Buying ends the episode. The score (0 to 1) rewards the right product type, the requested \
attributes and options, the price limit and the rating limit.";

pub fn search_page(goal: &str) -> String {
    format!("WebShop\nInstruction: {goal}\n[Search]")
}

pub fn results_page(
    goal: &str,
    cat: &Catalogue,
    query: &str,
    items: &[u32],
    page: usize,
    total: usize,
) -> String {
    let mut out = format!(
        "Instruction: {goal}\n[Back to Search]\nResults for \"{query}\": page {} of {} \
         (total results: {total})\n",
        page + 1,
        total.div_ceil(PER_PAGE).max(1)
    );
    if page > 0 {
        out.push_str("[< Prev] ");
    }
    if (page + 1) * PER_PAGE < total {
        out.push_str("[Next >]");
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if items.is_empty() {
        out.push_str("No products match your search.\n");
    }
    for &p in items {
        let p = &cat.products[p as usize];
        out.push_str(&format!("[{}] {} | {}\n", p.id, p.title, p.price_text()));
    }
    out.truncate(out.trim_end().len());
    out
}

fn selected_text(p: &Product, chosen: &[Option<u8>]) -> String {
    let def = p.category_def();
    let picked: Vec<String> = chosen
        .iter()
        .enumerate()
        .filter_map(|(d, v)| v.map(|v| format!("{}: {}", def.options[d].0, p.option_text(d, v))))
        .collect();
    if picked.is_empty() {
        "none".into()
    } else {
        picked.join(", ")
    }
}

pub fn product_page(goal: &str, p: &Product, chosen: &[Option<u8>]) -> String {
    let def = p.category_def();
    let mut out = format!(
        "Instruction: {goal}\n[Back to Search]\n[< Prev]\n{}\nPrice: {}\nRating: {} out of 5 \
         ({} reviews)\n",
        p.title,
        p.price_text(),
        p.rating_text(),
        p.reviews
    );
    for (dim, values) in p.options.iter().enumerate() {
        out.push_str(def.options[dim].0);
        out.push(':');
        for &v in values {
            out.push_str(&format!(" [{}]", p.option_text(dim, v)));
        }
        out.push('\n');
    }
    out.push_str(&format!("Selected options: {}\n", selected_text(p, chosen)));
    out.push_str(&format!("Description: {}\n[Buy Now]", p.description));
    out
}

pub fn done_page(p: &Product, chosen: &[Option<u8>], r: &Reward) -> String {
    let rating = match r.rating_ok {
        None => "no rating limit".to_string(),
        Some(ok) => format!("rating ok: {ok}"),
    };
    format!(
        "Thank you for shopping with us!\nYou bought: {} ({}) for {}\n\
         Your score (min 0.0, max 1.0): {:.2}\n(type match {:.1}, attributes {}/{}, \
         options {}/{}, price ok: {}, {rating})",
        p.title,
        selected_text(p, chosen),
        p.price_text(),
        r.total(),
        r.r_type,
        r.attr_hits,
        r.attr_total,
        r.option_hits,
        r.option_total,
        r.price_ok
    )
}
