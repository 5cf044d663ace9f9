//! relevance: the lessons a task sees, ranked by its tools, its features and (weakly) its
//! goal's words, and the fenced block they are injected in.

use std::collections::BTreeSet;

use super::context::render;
use super::{AdaptiveConfig, AdaptiveStrategies, RelevanceQuery, ScoredLesson};
use crate::record::Lesson;

/// Lowercased words of a text, for the minor word-overlap signal.
fn word_set(text: &str) -> BTreeSet<String> {
    words(&text.to_lowercase()).map(str::to_string).collect()
}

/// The words of lowercased `text` that relevance counts (longer than two bytes).
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
}

impl AdaptiveStrategies {
    /// The most relevant active lessons of a scope for a task, best first (at most `top_k`).
    /// Relevance comes from the task's tools (a lesson about a planned tool), its features (a
    /// lesson whose preconditions hold; a lesson with a contradicted precondition is never
    /// returned) and, weakly, the goal's words; it is multiplied by the confidence. Lessons
    /// below the floor, expired or superseded are never returned.
    pub fn relevant(
        &self,
        scope: &str,
        query: RelevanceQuery<'_>,
        now_ms: u64,
    ) -> Vec<ScoredLesson> {
        ranked(&self.state.config, self.lessons(scope), query, now_ms)
            .into_iter()
            .map(|(score, l)| ScoredLesson {
                lesson: l.clone(),
                score,
            })
            .collect()
    }
}

/// The fenced `<strategy_context>` block for a task from `lessons`, one scope's lessons
/// ([`AdaptiveStrategies::lessons`], or a reader's copy of them), see
/// [`render_strategy_context`](super::render_strategy_context).
pub fn strategy_context(
    cfg: &AdaptiveConfig,
    lessons: &[Lesson],
    query: RelevanceQuery<'_>,
    now_ms: u64,
) -> Option<String> {
    render(
        ranked(cfg, lessons, query, now_ms)
            .into_iter()
            .map(|(_, l)| l),
    )
}

/// The lessons of `lessons` (one scope's) relevant to a task, best first, with their scores
/// (see [`AdaptiveStrategies::relevant`]).
fn ranked<'a>(
    cfg: &AdaptiveConfig,
    lessons: &'a [Lesson],
    query: RelevanceQuery<'_>,
    now_ms: u64,
) -> Vec<(f64, &'a Lesson)> {
    let goal_words = word_set(query.goal);
    let mut shared: Vec<&str> = Vec::new();
    let mut word = String::new();
    let mut scored: Vec<(f64, &Lesson)> = lessons
        .iter()
        .filter(|l| l.superseded_by.is_none())
        .filter(|l| l.confidence >= cfg.min_confidence - 1e-9)
        .filter(|l| {
            cfg.strategy_ttl_ms == 0
                || now_ms.saturating_sub(l.reinforced_ms) <= cfg.strategy_ttl_ms
        })
        .filter_map(|l| {
            let mut matched = 0usize;
            for (k, v) in &l.preconditions {
                match query.features.get(k) {
                    Some(x) if x == v => matched += 1,
                    Some(_) => return None,
                    None => {}
                }
            }
            let tool_score = match &l.tool {
                Some(t) if query.tools.iter().any(|q| q == t) => 2.0,
                _ => 0.0,
            };
            // A lesson that holds everywhere is half as specific as one whose
            // preconditions all hold here.
            let feature_score = if l.preconditions.is_empty() {
                0.5
            } else {
                matched as f64 / l.preconditions.len() as f64
            };
            // The share of the goal's words the lesson (its action and its tool) speaks
            // of (a long lesson is not diluted by its own length).
            shared.clear();
            let mut share = |w: &str| {
                if let Some(g) = goal_words.get(w)
                    && !shared.contains(&g.as_str())
                {
                    shared.push(g);
                }
            };
            for text in std::iter::once(l.action.as_str()).chain(l.tool.as_deref()) {
                if text.is_ascii() {
                    // The same words without a lowercased copy of the text per lesson.
                    for w in words(text) {
                        word.clear();
                        word.extend(w.bytes().map(|b| char::from(b.to_ascii_lowercase())));
                        share(&word);
                    }
                } else {
                    words(&text.to_lowercase()).for_each(&mut share);
                }
            }
            let inter = shared.len() as f64;
            let word_score = 0.5 * inter / goal_words.len().max(1) as f64;
            // Something must tie the lesson to the task: its tool, a precondition that
            // holds, or a word of the goal.
            let tied = tool_score > 0.0 || matched > 0 || inter > 0.0;
            let raw = tool_score + feature_score + word_score;
            (tied && raw > 0.0).then_some((raw * l.confidence, l))
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.lesson_id.cmp(&b.1.lesson_id)));
    scored.truncate(cfg.top_k);
    scored
}
