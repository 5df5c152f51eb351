//! The threshold of a metric's `success` condition, drawn on the Platform page's chart
//! (docs/analysis.md, "Seeing it"): for a condition that is one comparison of `result`
//! alone with an expression over `baseline` and numbers (`result <= baseline * 1.2 +
//! 0.01`, `0.99 < result`), that expression evaluated at each measurement's baseline.
//! Any other condition (`result >= 0.9 && result <= 1`, `math::abs(result) < 1`) has no
//! single bound: the chart says so instead of drawing one.

use evalexpr::{
    ContextWithMutableVariables, DefaultNumericTypes, HashMapContext, Node, Operator, Value,
};
use manent_model::Analysis;

use super::Measurement;

/// The side of `condition` that `result` is compared with, when the condition is one
/// comparison (`<`, `<=`, `>`, `>=`, `==`) of `result` alone with an expression that does
/// not name `result`.
fn bound_side(condition: &str) -> Option<Node<DefaultNumericTypes>> {
    let tree = evalexpr::build_operator_tree::<DefaultNumericTypes>(condition).ok()?;
    let mut node = &tree;
    // The root, and parentheses around the whole condition, hold exactly one child.
    while matches!(node.operator(), Operator::RootNode) && node.children().len() == 1 {
        node = &node.children()[0];
    }
    let comparison = matches!(
        node.operator(),
        Operator::Lt | Operator::Leq | Operator::Gt | Operator::Geq | Operator::Eq
    );
    let [left, right] = node.children() else {
        return None;
    };
    if !comparison {
        return None;
    }
    let is_result = |n: &Node<DefaultNumericTypes>| matches!(n.operator(), Operator::VariableIdentifierRead { identifier } if identifier == "result");
    let names_result =
        |n: &Node<DefaultNumericTypes>| n.iter_variable_identifiers().any(|v| v == "result");
    match (is_result(left), is_result(right)) {
        (true, false) if !names_result(right) => Some(right.clone()),
        (false, true) if !names_result(left) => Some(left.clone()),
        _ => None,
    }
}

/// The bound `condition` compares `result` with, at `baseline`: `None` when the condition
/// has no single bound, or when its bound names a baseline this measurement lacks.
pub fn threshold(condition: &str, baseline: Option<f64>) -> Option<f64> {
    let bound = bound_side(condition)?;
    let mut context = HashMapContext::<DefaultNumericTypes>::new();
    if let Some(baseline) = baseline {
        context
            .set_value("baseline".into(), Value::from_float(baseline))
            .ok()?;
    }
    bound
        .eval_number_with_context(&context)
        .ok()
        .filter(|v| v.is_finite())
}

/// Whether `condition` has a single bound the chart can draw.
pub fn has_threshold(condition: &str) -> bool {
    bound_side(condition).is_some()
}

/// Sets each measurement's `threshold` from its metric's condition in `analysis` (the
/// deploy's effective descriptor's, as it ran).
pub fn fill(analysis: Option<&Analysis>, measurements: &mut [Measurement]) {
    let Some(analysis) = analysis else {
        return;
    };
    for m in measurements {
        m.threshold = analysis
            .metrics
            .iter()
            .find(|metric| metric.name == m.metric)
            .and_then(|metric| threshold(&metric.success, m.baseline));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threshold of `condition` at `baseline`, as text (`none` without one).
    fn check(condition: &str, baseline: Option<f64>, expect: expect_test::Expect) {
        let found = threshold(condition, baseline).map_or("none".to_string(), |v| v.to_string());
        expect.assert_eq(&found);
    }

    #[test]
    fn a_comparison_of_result_with_an_expression_has_that_expression_as_its_threshold() {
        check("result < 0.05", None, expect_test::expect!["0.05"]);
        check(
            "result <= baseline * 2 + 0.01",
            Some(0.02),
            expect_test::expect!["0.05"],
        );
        check("(result >= 10)", None, expect_test::expect!["10"]);
        check("0.99 <= result", None, expect_test::expect!["0.99"]);
        check(
            "result < max(baseline, 0.1)",
            Some(0.5),
            expect_test::expect!["0.5"],
        );
    }

    #[test]
    fn a_condition_without_a_single_bound_has_no_threshold() {
        check(
            "result >= 0.9 && result <= 1",
            None,
            expect_test::expect!["none"],
        );
        check("math::abs(result) < 1", None, expect_test::expect!["none"]);
        check("result < result * 2", None, expect_test::expect!["none"]);
        check("!(result > 1)", None, expect_test::expect!["none"]);
        check("result != 0", None, expect_test::expect!["none"]);
    }

    #[test]
    fn a_bound_over_a_baseline_that_could_not_be_measured_has_no_threshold() {
        check(
            "result <= baseline * 1.2",
            None,
            expect_test::expect!["none"],
        );
        assert!(
            has_threshold("result <= baseline * 1.2"),
            "the condition has a bound, drawn where the baseline was measured"
        );
    }
}
