//! Action helpers of TextCraft: the valid-action list and the oracle planner.

use super::book::Book;

/// `inventory`, then `get` of every base input of the listed recipes (count as listed),
/// then each listed recipe as a concrete craft command (tag inputs replaced by an item of
/// that tag: one held, else one a listed recipe makes, else the tag's first member).
pub fn valid_actions(book: &Book, listed: &[u32], inventory: &[(u32, u64)]) -> Vec<String> {
    let mut out = vec!["inventory".to_string()];
    for &r in listed {
        for i in &book.recipe(r).inputs {
            let n = book.name(i.name);
            if n.gettable() {
                let a = format!("get {} {}", i.count, n.display);
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
    }
    for &r in listed {
        let recipe = book.recipe(r);
        let mut a = format!(
            "craft {} {} using ",
            recipe.count,
            book.name(recipe.output).display
        );
        for (k, i) in recipe.inputs.iter().enumerate() {
            if k > 0 {
                a.push_str(", ");
            }
            let item = if i.is_tag {
                concrete(book, i.name, listed, inventory)
            } else {
                i.name
            };
            a.push_str(&format!("{} {}", i.count, book.name(item).display));
        }
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

fn concrete(book: &Book, tag: u32, listed: &[u32], inventory: &[(u32, u64)]) -> u32 {
    let has_tag = |item: u32| book.name(item).tag == Some(tag);
    if let Some(&(item, _)) = inventory.iter().find(|e| has_tag(e.0)) {
        return item;
    }
    if let Some(&r) = listed.iter().find(|&&r| has_tag(book.recipe(r).output)) {
        return book.recipe(r).output;
    }
    book.name(tag).members.first().copied().unwrap_or(tag)
}

struct Planner<'a> {
    book: &'a Book,
    inv: Vec<(u32, u64)>,
    out: Vec<String>,
}

impl Planner<'_> {
    fn held(&self, name: u32) -> u64 {
        self.inv.iter().find(|e| e.0 == name).map_or(0, |e| e.1)
    }

    fn change(&mut self, name: u32, delta: i128) {
        match self.inv.iter_mut().find(|e| e.0 == name) {
            Some(e) => e.1 = (i128::from(e.1) + delta).clamp(0, i128::from(u64::MAX)) as u64,
            None => self.inv.push((name, delta.max(0) as u64)),
        }
    }

    /// Pick a concrete item for a tag input: a held member with enough, else the member
    /// held most, else the shallowest craftable member.
    fn member(&self, tag: u32, need: u64) -> Option<u32> {
        let members = &self.book.name(tag).members;
        let usable = |&&m: &&u32| {
            let n = self.book.name(m);
            !n.item_recipes.is_empty() || n.gettable()
        };
        if let Some(&m) = members
            .iter()
            .filter(usable)
            .find(|&&m| self.held(m) >= need)
        {
            return Some(m);
        }
        let most = members.iter().filter(usable).max_by_key(|&&m| self.held(m));
        if let Some(&m) = most.filter(|&&m| self.held(m) > 0) {
            return Some(m);
        }
        members
            .iter()
            .filter(usable)
            .min_by_key(|&&m| self.book.name(m).depth)
            .copied()
    }

    /// Plan actions until `need` of `item` are held (inventory simulated as the env does).
    fn ensure(&mut self, item: u32, need: u64, depth: usize) -> Option<()> {
        let have = self.held(item);
        if have >= need {
            return Some(());
        }
        if depth > 32 {
            return None;
        }
        let deficit = need - have;
        let book = self.book;
        let name = book.name(item);
        if name.gettable() {
            self.out.push(format!("get {deficit} {}", name.display));
            self.change(item, i128::from(deficit));
            return Some(());
        }
        let recipe_depth = |r: &u32| {
            let inputs = &book.recipe(*r).inputs;
            inputs
                .iter()
                .map(|i| book.name(i.name).depth + 1)
                .max()
                .unwrap_or(0)
        };
        let &r = name.item_recipes.iter().min_by_key(|r| recipe_depth(r))?;
        let recipe = book.recipe(r);
        let batches = deficit.div_ceil(recipe.count);
        let mut parts = Vec::with_capacity(recipe.inputs.len());
        for i in &recipe.inputs {
            let total = batches.saturating_mul(i.count);
            let concrete = if i.is_tag {
                self.member(i.name, total)?
            } else {
                i.name
            };
            self.ensure(concrete, total, depth + 1)?;
            self.change(concrete, -i128::from(total)); // reserve for this craft
            parts.push((concrete, i.count, total));
        }
        let mut cmd = format!("craft {} {} using ", recipe.count, name.display);
        for (k, &(c, per, _)) in parts.iter().enumerate() {
            if k > 0 {
                cmd.push_str(", ");
            }
            cmd.push_str(&format!("{per} {}", book.name(c).display));
        }
        for _ in 0..batches {
            self.out.push(cmd.clone());
        }
        self.change(item, i128::from(batches.saturating_mul(recipe.count)));
        Some(())
    }
}

/// A full action sequence that crafts `goal` from `inventory`, or None if none is found.
pub fn plan(book: &Book, goal: u32, inventory: &[(u32, u64)]) -> Option<Vec<String>> {
    let mut p = Planner {
        book,
        inv: inventory.to_vec(),
        out: Vec::new(),
    };
    let need = p.held(goal).saturating_add(1);
    p.ensure(goal, need, 0)?;
    Some(p.out)
}
