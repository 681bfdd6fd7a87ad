"""Stream the Pima data through ``partial_fit`` and watch the posterior settle.

Run: ``python examples/streaming_pima.py``.  Prints, after every chunk of 40 patients, the
held-out log-likelihood and the 95 % credible interval of the glucose coefficient, then the
same numbers for a batch ``fit`` on all training rows.
"""

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from skcep import CEPProbitClassifier
from skcep.datasets import load_pima


def main(chunk_size=40):
    data = load_pima()
    X_train, X_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.3, random_state=0, stratify=data.target
    )
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    glucose = list(data.feature_names).index("glu")

    def report(label, clf):
        log_proba = clf.predict_log_proba(X_test)[np.arange(y_test.size), y_test]
        mean, sd = clf.coef_[0, glucose], np.sqrt(clf.coef_var_[0, glucose])
        print(f"{label:>14}  test loglik {log_proba.mean():+.4f}   glu {mean:+.3f} "
              f"[{mean - 1.96 * sd:+.3f}, {mean + 1.96 * sd:+.3f}]")

    stream = CEPProbitClassifier(method="ep")
    for start in range(0, len(y_train), chunk_size):
        rows = slice(start, start + chunk_size)
        stream.partial_fit(X_train[rows], y_train[rows], classes=[0, 1])
        report(f"{min(start + chunk_size, len(y_train))} seen", stream)
    report("batch fit", CEPProbitClassifier(method="ep").fit(X_train, y_train))


if __name__ == "__main__":
    main()
