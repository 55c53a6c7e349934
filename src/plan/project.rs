//! A project: the recipe, the compatibility matrix, the lock file beside the recipe, and the
//! plan they resolve to. Every command that works on a recipe (`check`, `plan`, `build`,
//! `engine`, `deploy`) loads it here, the same way, and picks its targets with
//! [`BuildPlan::select`].

use std::path::{Path, PathBuf};

use super::lock::{self, Lock};
use super::{BuildPlan, Error};
use crate::matrix::Matrix;
use crate::recipe::Recipe;

/// A loaded project.
#[derive(Debug)]
pub struct Project {
    pub recipe: Recipe,
    pub matrix: Matrix,
    /// The lock file's path, beside the recipe (it may not exist yet).
    pub lock_path: PathBuf,
    /// The lock file, when there is one.
    pub lock: Option<Lock>,
    pub plan: BuildPlan,
}

impl Project {
    /// Load the recipe at `recipe`, the matrix (`matrix`, else the default one), the lock file
    /// beside the recipe, and resolve the plan.
    pub fn load(recipe: &Path, matrix: Option<&Path>) -> Result<Project, Error> {
        let recipe = crate::recipe::load(recipe)?;
        let matrix = crate::matrix::load(matrix)?;
        let lock_path = lock::path_for(&recipe.file);
        let lock = lock::read(&lock_path)?;
        let plan = super::resolve(&recipe, &matrix, lock.as_ref())?;
        Ok(Project {
            recipe,
            matrix,
            lock_path,
            lock,
            plan,
        })
    }
}
