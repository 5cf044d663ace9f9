//! niches: specialists and the arms unlucky early: second looks by fallbacks, niches behind
//! failures elsewhere, and rare cells.

use super::*;

/// A specialist that failed once in its niche (one success, one failure) against a
/// generalist known to succeed 78% of the time there: the policy still tries it now and then
/// (3% of the draws here).
#[test]
fn a_specialist_unlucky_once_in_its_niche_is_tried_again() {
    let stages = vec![StageArms {
        stage: "search".into(),
        arms: vec![Arm::new("web", "top10"), Arm::new("scholar", "citations")],
    }];
    let science = feats(&[("topic", "science")]);
    let teach = |p: &mut Policy| {
        for i in 0..100 {
            let ok = (i * 7) % 100 < 78;
            search_obs(p, &science, Arm::new("web", "top10"), ok);
        }
        for ok in [true, false] {
            search_obs(p, &science, Arm::new("scholar", "citations"), ok);
        }
    };
    let mut p = Policy::new(PolicyConfig::default(), stages).unwrap();
    teach(&mut p);
    let now = draw_share(&p, &science, &[1], 9);
    assert!(now >= 0.02, "now {now}");
}

/// A "search" stage of a leader, an arm known to succeed 80% of the time and an unsure one
/// (3 successes, 2 failures), taught in the news niche (`topic = news`, 117 visits).
fn unsure_in_news(tune: impl FnOnce(&mut Tuning)) -> Policy {
    let mut p = tuned(
        PolicyConfig::default(),
        search_stage(&["leader", "known", "unsure"]),
        tune,
    );
    let niche = feats(&[("topic", "news")]);
    for (arm, successes, failures) in [("leader", 60, 2), ("known", 40, 10), ("unsure", 3, 2)] {
        search_spread(&mut p, &niche, arm, successes, failures);
    }
    p
}

/// After the leader failed on a task, the fallback is judged on the plain posterior: an arm
/// with 3 successes and 2 failures in the niche gets the second look its evidence allows,
/// against an arm known to succeed 80% of the time: by upper bound (the default) every
/// fallback, since its bound is the higher; drawn, 9% of them.
#[test]
fn a_fallback_gives_an_arm_unlucky_early_the_look_its_evidence_allows() {
    let niche = feats(&[("topic", "news")]);
    // Without the second look from the cell's own counts (tested on its own below).
    let by_bound = fallback_share(
        &unsure_in_news(|t| t.fallback_local_visits = 0.0),
        &niche,
        2,
        5,
    );
    assert!(by_bound == 1.0, "by upper bound {by_bound}");
    let drawn = unsure_in_news(|t| {
        t.fallback_local_visits = 0.0;
        t.fallback_upper_sd = 0.0;
    });
    let drawn = fallback_share(&drawn, &niche, 2, 5);
    assert!((0.06..0.3).contains(&drawn), "drawn {drawn}");
}

/// A fallback logs the probability it had: 1 when it drew nothing (upper bounds, no busy
/// cell), and when it drew (from the posterior, or from an arm's own counts in a busy cell),
/// a resampled estimate that agrees with how often each arm is in fact chosen; and estimating
/// it leaves the policy's generator where the choice alone would have.
#[test]
fn a_fallback_logs_the_propensity_it_had() {
    let niche = feats(&[("topic", "news")]);
    let mut rng = fastrand::Rng::with_seed(3);
    let bound = unsure_in_news(|t| t.fallback_local_visits = 0.0);
    assert_eq!(
        bound.fallback_with_propensity(&niche, 0, &[0], &mut rng),
        Some((2, 1.0))
    );
    // Drawn: per arm, how often it is chosen against the mean propensity logged with it.
    let drawn = |t: &mut Tuning| {
        t.fallback_local_visits = 0.0;
        t.fallback_upper_sd = 0.0;
    };
    // The news cell has 117 visits: a busy cell, so the bound is raised by draws.
    for p in [unsure_in_news(drawn), unsure_in_news(|_| {})] {
        let n = 3000;
        let mut chosen = [0usize; 3];
        let mut logged = [0.0f64; 3];
        for _ in 0..n {
            let (a, prop) = p
                .fallback_with_propensity(&niche, 0, &[0], &mut rng)
                .unwrap();
            assert!(prop > 0.0 && prop <= 1.0, "propensity {prop}");
            chosen[a] += 1;
            logged[a] += prop;
        }
        assert_eq!(chosen[0], 0, "the arm tried is not a fallback");
        assert!(chosen[1] > 0 && chosen[2] > 0, "{chosen:?}");
        for a in 1..3 {
            let share = chosen[a] as f64 / n as f64;
            let mean = logged[a] / chosen[a] as f64;
            // The estimate counts the choice made among its 33: (32 share + 1) / 33 on
            // average, so within about 0.03 of the share plus sampling noise.
            assert!(
                (mean - share).abs() < 0.06,
                "arm {a}: chosen {share:.3} of the time, logged {mean:.3}"
            );
        }
        // Logging the propensity changes no later choice: the generator goes on as after a
        // fallback chosen without it.
        let (mut a, mut b) = (fastrand::Rng::with_seed(11), fastrand::Rng::with_seed(11));
        let plain = p.fallback(&niche, 0, &[0], &mut a);
        let logged = p.fallback_with_propensity(&niche, 0, &[0], &mut b);
        assert_eq!(plain, logged.map(|(arm, _)| arm));
        assert_eq!(a.u64(..), b.u64(..));
    }
}

#[test]
fn a_fallback_takes_a_second_look_at_an_arm_unlucky_in_a_busy_cell() {
    // "law" is poor off its niche (4 of 20 in each other topic) and was tried twice in its
    // busy niche, once failing; pooled with the other topics it looks poor there too.
    let stages = search_stage(&["web", "law", "crawler"]);
    let legal = feats(&[("topic", "legal")]);
    let share = |local_visits: f64| {
        let mut p = tuned(PolicyConfig::default(), stages.clone(), |t| {
            t.fallback_local_visits = local_visits;
        });
        for topic in ["news", "product", "science"] {
            let f = feats(&[("topic", topic)]);
            for (arm, successes, failures) in [("web", 50, 10), ("law", 4, 16), ("crawler", 30, 20)]
            {
                search_spread(&mut p, &f, arm, successes, failures);
            }
        }
        for (arm, successes, failures) in [("web", 40, 10), ("law", 1, 1), ("crawler", 10, 10)] {
            search_spread(&mut p, &legal, arm, successes, failures);
        }
        fallback_share(&p, &legal, 1, 9)
    };
    let second_look = share(Tuning::default().fallback_local_visits);
    let pooled_only = share(0.0);
    assert!(
        second_look >= 0.15 && second_look >= 2.0 * pooled_only,
        "with the second look {second_look}, pooled only {pooled_only}"
    );
}

/// A fallback is judged on the levels' evidence alone, without the structure prior: after
/// the leader failed in a niche where a specialist (poor elsewhere) succeeded twice, the
/// specialist gets the fallback as often as with no prior at all (8.1% of the draws here).
/// Measured with fallbacks drawn, whose shares show it.
#[test]
fn a_fallback_looks_for_a_niche_without_the_structure_prior() {
    let stages = search_stage(&["leader", "fair", "special"]);
    let niche = feats(&[("depth", "quick"), ("lang", "en"), ("topic", "d")]);
    let share = |structure_prior: f64| {
        let config = PolicyConfig {
            structure_prior,
            ..PolicyConfig::default()
        };
        let mut p = tuned(config, stages.clone(), |t| t.fallback_upper_sd = 0.0);
        for topic in ["a", "b", "c"] {
            for depth in ["quick", "deep"] {
                let f = feats(&[("depth", depth), ("lang", "en"), ("topic", topic)]);
                search_spread(&mut p, &f, "leader", 16, 4);
                search_spread(&mut p, &f, "fair", 12, 8);
                search_spread(&mut p, &f, "special", 1, 5);
            }
        }
        search_spread(&mut p, &niche, "leader", 3, 2);
        search_spread(&mut p, &niche, "special", 2, 0);
        fallback_share(&p, &niche, 2, 9)
    };
    let (exempt, flat) = (share(1.0), share(0.0));
    assert_eq!(exempt, flat, "the fallback ignores the structure prior");
    assert!(exempt > 0.05, "fallback share of the specialist: {exempt}");
}

#[test]
fn a_specialists_successes_elsewhere_do_not_lift_it_where_it_failed() {
    // law_db is chosen on legal questions, where it works, and fails the three times it
    // was tried on product questions. Its global counts say 0.95; on product it is poor: a
    // single feature's cell starts from the flat prior, not from the global counts.
    let estimate = || {
        let config = PolicyConfig::default();
        let stages = vec![StageArms {
            stage: "search".into(),
            arms: vec![Arm::new("law_db", "statutes"), Arm::new("web", "top10")],
        }];
        let mut p = Policy::new(config, stages).unwrap();
        let obs = |topic: &str, ok: bool| {
            let f = feats(&[("language", "en"), ("topic", topic)]);
            stage_obs(
                f,
                "search",
                Arm::new("law_db", "statutes"),
                ok,
                3000.0,
                0.03,
            )
        };
        for i in 0..63 {
            if i % 20 == 19 {
                p.update(&obs("product", false));
            } else {
                p.update(&obs("legal", true));
            }
        }
        let product = feats(&[("language", "en"), ("topic", "product")]);
        let r = p.rank_stage(&product, 0);
        r.iter().find(|x| x.0 == 0).map(|x| x.1).unwrap()
    };
    let own = estimate();
    assert!(own < 0.15, "law_db on product: {own}");
}

#[test]
fn failures_outside_its_niche_do_not_hide_the_niche() {
    // "special" works on topic d only; "general" is fair everywhere. The policy first sees
    // topics a-c (where trying "special" fails), then topic d: it must still find "special"
    // there. Over 20 seeds it does 19 times, with or without `rarity_sharpen`. (First
    // attempts alone, with no fallback, found it 17 times before `rarity_sharpen` and 2
    // times with it: topic d's cell is far rarer than its parent when it appears, so its
    // first attempts stay near the parent's estimate, and the fallback after "general"
    // fails is what gives "special" its look there.)
    let stages = search_stage(&["general", "special"]);
    let mut wins = 0;
    for seed in 0..20 {
        let mut p = Policy::new(PolicyConfig::default(), stages.clone()).unwrap();
        let mut rng = fastrand::Rng::with_seed(seed);
        let run = |p: &mut Policy, topic: &str, rng: &mut fastrand::Rng| {
            let f = feats(&[
                ("depth", if rng.bool() { "quick" } else { "deep" }),
                ("topic", topic),
            ]);
            let c = p.choose(&f, rng);
            let ps = |a: usize| match (a, topic) {
                (0, _) => 0.75,
                (_, "d") => 0.95,
                _ => 0.1,
            };
            // As the runtime does: a failed stage falls back to another arm.
            let mut tried = vec![c.indices[0]];
            let mut stages_seen = Vec::new();
            loop {
                let a = tried[tried.len() - 1];
                let ok = rng.f64() < ps(a);
                let arm = stages[0].arms[a].clone();
                let o = stage_obs(f.clone(), "search", arm, ok, 1000.0, 0.001);
                stages_seen.extend(o.stages);
                if ok || tried.len() > 1 {
                    break;
                }
                match p.fallback(&f, 0, &tried, rng) {
                    Some(next) => tried.push(next),
                    None => break,
                }
            }
            p.update(&Observation {
                features: f,
                stages: stages_seen,
            });
        };
        for i in 0..60 {
            run(&mut p, ["a", "b", "c"][i % 3], &mut rng);
        }
        for _ in 0..60 {
            run(&mut p, "d", &mut rng);
        }
        let d = feats(&[("depth", "quick"), ("topic", "d")]);
        wins += usize::from(p.greedy(&d).0[0] == 1);
    }
    assert!(wins >= 16, "the niche was found in {wins} of 20 runs");
}

/// A cell far rarer than its parent explores around the parent's estimate: an arm its
/// parents know to be poor is seldom tried there, where without rarity sharpening its broad
/// cell prior sends it a share of the draws (0 of 4,000 draws against 5%). The means (the
/// greedy plan) are the same.
#[test]
fn a_rare_cell_explores_less_than_a_busy_one_and_keeps_its_means() {
    let poor_share = |rarity: f64| {
        let (p, rare) = rare_cell_policy(thompson(), |t| t.rarity_sharpen = rarity, 200);
        (draw_share(&p, &rare, &[1], 3), p.greedy(&rare))
    };
    let (with, greedy_with) = poor_share(Tuning::default().rarity_sharpen);
    let (without, greedy_without) = poor_share(0.0);
    assert!(without > 0.02, "without rarity {without}");
    assert!(with < without / 3.0, "with {with}, without {without}");
    assert_eq!(greedy_with, greedy_without);
}

/// With the tuning's `rarity_min_parent_fine` below the floor, a rare cell fixing two features is held
/// to its parents' estimate early (its busiest parent has had 61 visits here), where the
/// default floor lets it explore as if new. Measured at an evidence sharpening of 3: at the
/// default 4 the levels' weights alone leave the poor arm about 1% of the draws there, with
/// either floor.
#[test]
fn a_lower_floor_for_the_finer_cells_holds_them_back_earlier() {
    let poor_share = |fine: f64| {
        let tune = |t: &mut Tuning| {
            t.rarity_min_parent_fine = fine;
            t.evidence_sharpen = 3.0;
        };
        let busy = feats(&[("kind", "common"), ("lang", "en")]);
        let rare = feats(&[("kind", "common"), ("lang", "fr")]);
        let (p, rare) = rare_cell_policy_in(thompson(), tune, 30, busy, rare);
        draw_share(&p, &rare, &[1], 3)
    };
    let (held, free) = (poor_share(20.0), poor_share(200.0));
    assert!(held < free * 0.8, "floor 20: {held}, floor 200: {free}");
}

/// Rarity holds a cell back only once its busiest parent has had `rarity_min_parent` (tuning)
/// visits: after 80 tasks (160 visits) a rare cell explores exactly as without rarity, and
/// after 200 tasks (400 visits) it explores less.
#[test]
fn rarity_waits_until_the_parent_has_seen_enough() {
    let poor_share = |rounds: usize, rarity: f64| {
        let (p, rare) = rare_cell_policy(thompson(), |t| t.rarity_sharpen = rarity, rounds);
        draw_share(&p, &rare, &[1], 3)
    };
    let (early, early_without) = (poor_share(80, 4.0), poor_share(80, 0.0));
    assert!(
        early > 0.02 && early == early_without,
        "{early} {early_without}"
    );
    let (later, later_without) = (poor_share(200, 4.0), poor_share(200, 0.0));
    assert!(later < later_without / 3.0, "{later} {later_without}");
}
